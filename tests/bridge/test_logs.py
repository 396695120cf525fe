from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.config import LoggingSettings
from bridge.logs import setup_logging
from tests.bridge.harness import run_console, write_config


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    setup_logging(LoggingSettings(level="INFO", format="json"), stream)
    yield stream
    root.handlers[:], level = saved
    root.setLevel(level)


async def test_json_lines_carry_room_and_run_and_no_message_text(
    tmp_path: Path, json_logs: io.StringIO
) -> None:
    config = write_config(tmp_path, env={"FAKE_CLAUDE_ECHO": "1", "GITHUB_TOKEN": "ghp_do_not_log"})
    await run_console(config, ["the secret plan"])
    entries = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    started = [e for e in entries if e["message"].startswith("run started")]
    ended = [e for e in entries if e["message"].startswith("run ended")]
    assert len(started) == len(ended) == 1
    assert started[0]["room"] == "console:console"
    assert started[0]["run"].startswith("run-")
    assert ended[0]["run"] == started[0]["run"]
    text = json_logs.getvalue()
    assert "the secret plan" not in text
    assert "ghp_do_not_log" not in text

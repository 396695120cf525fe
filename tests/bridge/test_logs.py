from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.config import LoggingSettings
from bridge.host.logs import OWN_PACKAGES, setup_logging
from tests.bridge.harness import run_console, write_config


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    own = {name: logging.getLogger(name).level for name in OWN_PACKAGES}
    yield
    root.handlers[:], level = saved
    root.setLevel(level)
    for name, own_level in own.items():
        logging.getLogger(name).setLevel(own_level)


@pytest.fixture
def json_logs(restore_logging: None) -> io.StringIO:
    stream = io.StringIO()
    setup_logging(LoggingSettings(level="INFO", format="json"), stream)
    return stream


LIBRARIES = ("nio.rooms", "aiosqlite", "markdown_it.rules_block", "slack_sdk.web", "peewee")


def test_debug_is_for_chatbridge_only_unless_libraries_are_asked_for(
    restore_logging: None,
) -> None:
    setup_logging(LoggingSettings(level="DEBUG"), io.StringIO())
    assert logging.getLogger("bridge.runs.executor").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("transports.matrix").isEnabledFor(logging.DEBUG)
    for name in LIBRARIES:
        logger = logging.getLogger(name)
        assert not logger.isEnabledFor(logging.INFO), name
        assert logger.isEnabledFor(logging.WARNING), name

    setup_logging(LoggingSettings(level="INFO", library_level="DEBUG"), io.StringIO())
    assert not logging.getLogger("bridge.runs.executor").isEnabledFor(logging.DEBUG)
    assert all(logging.getLogger(name).isEnabledFor(logging.DEBUG) for name in LIBRARIES)


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

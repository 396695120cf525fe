"""The state directory's disk full while claude answers: the room is told what happened
and still gets the answer (the real service, supervisor and a real full tmpfs)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.config import load_settings
from bridge.core.model import ReplyKind
from tests.bridge.chat_room import ChatRoom, console_room, serving
from tests.bridge.harness import write_config
from tests.small_disk import SmallDisk, needs_mount

pytestmark = [pytest.mark.slow, needs_mount]

ANSWER = "THE-ANSWER " * 1000
"""Over a page: a full tmpfs still takes what fits in a file's last page."""


async def test_an_answer_printed_while_the_disk_is_full_reaches_the_room_and_says_why(
    tmp_path: Path,
    small_disk: SmallDisk,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("CHATBRIDGE_RUNNER__STATE_DIR", str(small_disk.root / "state"))
    go = tmp_path / "go"
    env = {
        "FAKE_CLAUDE_NO_TOOL": "1",
        "FAKE_CLAUDE_WAIT_FOR": str(go),
        "FAKE_CLAUDE_RESULT": ANSWER,
    }
    settings = load_settings(write_config(tmp_path, env=env))
    chat = ChatRoom(console_room(settings), "local")
    async with serving(settings, chat) as (service, _):
        await chat.say("hello")
        await chat.wait_until(lambda: bool(chat.texts()))  # the run's status: it runs
        small_disk.fill()
        go.touch()
        try:
            async with asyncio.timeout(30):  # not after the idle timeout
                await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
        finally:
            small_disk.free()
        counted = service.parts.metrics.registry.get_sample_value(
            "chatbridge_journal_unwritable_total"
        )
    assert chat.texts(ReplyKind.RESULT) == [ANSWER.strip()]
    [told] = [t for t in chat.texts(ReplyKind.NOTICE) if "state directory" in t]
    assert "No space left on device" in told
    assert counted == 1  # the operator's metric, and the log:
    [logged] = [r for r in caplog.records if "journal cannot be written" in r.getMessage()]
    assert logged.levelname == "WARNING"

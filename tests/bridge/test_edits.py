"""Edits and deletions of messages that have not run yet, through the real service."""

from __future__ import annotations

import json
from pathlib import Path

from bridge.config import load_settings
from bridge.core.model import ExternalMessageId, ReplyKind
from bridge.core.transport import Accepted
from tests.bridge.chat_room import serving
from tests.bridge.harness import rows, write_config


async def test_edits_and_deletions_change_only_what_waits(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    # A window longer than the test: the batch closes when it holds three messages.
    config = {"dispatcher": {"coalesce_ms": 600_000, "max_wait_ms": 600_000, "max_batch": 3}}
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_RECORD": str(record)}
    settings = load_settings(write_config(tmp_path, config, env=env))
    async with serving(settings) as (service, chat):
        one, _ = await chat.say("one")
        two, _ = await chat.say("two")
        assert await chat.edited(one, "one, edited") is Accepted.ACCEPTED
        assert await chat.edited(one, "one, edited") is Accepted.IGNORED  # redelivered
        assert await chat.deleted(two) is Accepted.ACCEPTED
        assert await chat.deleted(two) is Accepted.IGNORED
        assert service.parts.dispatcher.status(chat.room).waiting == 1
        # An edit that comes before its original creates nothing.
        assert await chat.edited(ExternalMessageId("in-9"), "early") is Accepted.IGNORED
        # Edits never turn a message into a command.
        assert await chat.edited(one, "!stop") is Accepted.IGNORED
        three, _ = await chat.say("three")
        four, _ = await chat.say("four")
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))

        # After the run: an edit or a deletion starts nothing.
        assert await chat.edited(three, "three, edited") is Accepted.IGNORED
        assert await chat.deleted(four) is Accepted.IGNORED
        assert service.parts.dispatcher.status(chat.room).waiting == 0

    prompt = json.loads(record.read_text())["prompt"]
    assert "one, edited" in prompt
    assert "two" not in prompt
    assert prompt.index("one, edited") < prompt.index("three") < prompt.index("four")
    assert rows(tmp_path, "select count(*) from runs") == [(1,)]
    states = rows(tmp_path, "select external_id, text, state from messages order by id")
    assert states == [
        ("in-1", "one, edited", "done"),
        ("in-2", "two", "dropped"),
        ("in-3", "three", "done"),
        ("in-4", "four", "done"),
    ]
    audit = rows(
        tmp_path,
        "select action, actor from audit where action in ('message_edited', 'message_deleted')",
    )
    assert audit == [("message_edited", "local"), ("message_deleted", "an-admin")]

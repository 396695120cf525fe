"""Tools approved from Matrix, end to end: ``chatbridge run`` with the fake claude asking for
each tool (``approve_tools``), against the test Synapse.

The request is a message the bot reacts to with ✅ 🔁 ❌; a person's ✅ lets the tool
run, ❌ denies it, and the request is edited into its outcome. Mallory is an approver
but not an allowed user: she may answer requests (docs/live-runs.md: only approvers
answer), while her messages start nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fakes.fake_claude import tool_log
from tests.transports.matrix.matrix_helpers import Human, Seen, joined, message_from
from tests.transports.matrix.matrix_service import service
from tests.transports.matrix.reactions import offered, react
from tests.transports.matrix.seen import ALICE, MALLORY, answer_to, edit_of, request_in
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

HOSTILE = "echo `id` @room [alice](https://matrix.to/#/@alice:localhost) <b>bold</b> \u202eexe.txt"
"""A command with a room ping, a pill, HTML and a bidi override in it."""


def file_from(bot: MatrixUser, room: str, name: str) -> Callable[[Seen], bool]:
    def match(seen: Seen) -> bool:
        return (
            message_from(bot.user_id, room)(seen)
            and seen.content.get("msgtype") == "m.file"
            and name in str(seen.content.get("body")) + str(seen.content.get("filename"))
        )

    return match


def reply_to(bot: MatrixUser, room: str, event_id: str, text: str) -> Callable[[Seen], bool]:
    def match(seen: Seen) -> bool:
        relates = seen.content.get("m.relates_to") or {}
        return (
            message_from(bot.user_id, room)(seen)
            and (relates.get("m.in_reply_to") or {}).get("event_id") == event_id
            and text in str(seen.content.get("body"))
        )

    return match


async def test_reactions_allow_and_deny_a_tool_use(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human, mallory: Human
) -> None:
    room = await alice.create_room([bot.user_id, mallory.user.user_id])
    await mallory.join(room)
    env = {
        "FAKE_CLAUDE_ECHO": "1",
        "FAKE_CLAUDE_TOOL_LOG": str(tmp_path / "tools.jsonl"),
        "FAKE_CLAUDE_TOOL_COMMAND": HOSTILE + " " + "x" * 100_000,
    }
    async with service(
        tmp_path,
        synapse,
        bot,
        room,
        allowed=(ALICE,),
        claude_env=env,
        room_extra={"approvers": [ALICE, MALLORY]},
        extra={"defaults": {"approve_tools": True}},
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "first task")
        request = await alice.wait_for(request_in(bot, room, "#1"))
        content = request.content
        # Nothing in the request pings anyone or renders as a link or markup.
        assert content.get("m.mentions") == {}
        body, html = str(content["body"]), str(content.get("formatted_body", ""))
        assert "\u202e" not in body + html
        assert "\\u{202e}" in body
        assert '<a href="https://matrix.to' not in html
        assert "<b>bold</b>" not in html
        assert len(body) < 20_000  # the 100 KB command is shortened, saying so,
        assert "characters (1 lines) not shown here" in body
        assert "x" * 100 + "\n```" in body  # its tail shown
        # ... and is whole in a file posted just before the request.
        whole = await alice.wait_for(file_from(bot, room, "request-1.md"))
        assert whole.source["origin_server_ts"] <= request.source["origin_server_ts"]
        event_id = str(request.source["event_id"])
        assert await offered(alice, event_id) == ["✅", "🔁", "❌"]
        assert tool_log(tmp_path) == []

        await mallory.sync(timeout_ms=0)  # (her client learns the room)
        await react(mallory, room, event_id, "✅")
        await alice.wait_for(answer_to(bot, room, "first task"))
        await alice.wait_for(edit_of(event_id, "allowed by"))
        assert len(tool_log(tmp_path)) == 1
        # A reaction too late decides nothing: the person is answered in a reply.
        await react(alice, room, event_id, "❌")
        await alice.wait_for(reply_to(bot, room, event_id, "Already answered"))

        await alice.send(room, "second task")
        second = await alice.wait_for(request_in(bot, room, "#2"))
        second_id = str(second.source["event_id"])
        await offered(alice, second_id)
        await react(alice, room, second_id, "❌")
        await alice.wait_for(answer_to(bot, room, "second task"))
        await alice.wait_for(edit_of(second_id, "denied"))
    assert len(tool_log(tmp_path)) == 1  # the denied tool never ran

"""Matrix's 🔁 reaction keeps chatbridge's session rule, end to end (``chatbridge run``,
the fake claude asking for its tool, the test Synapse): the next run resuming the
session runs the same command unasked; claude gets no rule of its own."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.fakes.fake_claude import tool_log
from tests.transports.matrix.matrix_helpers import Human, joined
from tests.transports.matrix.matrix_service import service
from tests.transports.matrix.reactions import offered, react
from tests.transports.matrix.seen import ALICE, answer_to, edit_of, request_in
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]


async def test_the_session_reaction_keeps_a_session_rule_the_next_run_uses(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_TOOL_LOG": str(tmp_path / "tools.jsonl")}
    async with service(
        tmp_path,
        synapse,
        bot,
        room,
        allowed=(ALICE,),
        claude_env=env,
        extra={"defaults": {"approve_tools": True}},
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "first task")
        request = await alice.wait_for(request_in(bot, room, "#1"))
        event_id = str(request.source["event_id"])
        await offered(alice, event_id)
        await react(alice, room, event_id, "🔁")
        await alice.wait_for(edit_of(event_id, "allowed for the session"))
        await alice.wait_for(answer_to(bot, room, "first task"))
        # The next run resumes the session: the same command runs, nobody is asked.
        await alice.send(room, "second task")
        await alice.wait_for(answer_to(bot, room, "second task"))
    assert [t["command"] for t in tool_log(tmp_path)] == ["echo hello", "echo hello"]
    with sqlite3.connect(tmp_path / "chatbridge.db") as db:
        kept = db.execute("select scope, effect, rule, created_by from tool_rules").fetchall()
        decided = db.execute("select number, state, message_id is null from approvals").fetchall()
    assert kept == [("session", "allow", "Bash(echo hello)", ALICE)]
    # #2 was decided by the rule and never posted.
    assert decided == [(1, "allowed_session", 0), (2, "allowed", 1)]

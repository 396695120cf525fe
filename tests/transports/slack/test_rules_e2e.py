"""Slack's "Allow for this session" button keeps chatbridge's session rule, end to end
(``chatbridge run``, the fake claude asking for its tool, local-slack): the next run
resuming the session runs the same command unasked; claude gets no rule of its own."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.fakes.fake_claude import tool_log
from tests.transports.slack import peer
from tests.transports.slack.approvals import (
    APPROVING,
    buttons,
    requests,
    wait_closed,
    wait_for_answer,
    wait_for_request,
)
from tests.transports.slack.service import bridged

pytestmark = [pytest.mark.slack, pytest.mark.slow]


async def test_the_session_button_keeps_a_session_rule_the_next_run_uses(tmp_path: Path) -> None:
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_TOOL_LOG": str(tmp_path / "tools.jsonl")}
    async with bridged(
        tmp_path, "socket", env, allowed=(peer.ALICE, peer.BOB), extra=APPROVING
    ) as b:
        await b.slack.post_message(peer.ALICE, "first task")
        request = await wait_for_request(b, 1)
        await b.slack.click(peer.BOB, str(request["ts"]), buttons(request)["allow_session"])
        await wait_closed(b, str(request["ts"]), "allowed for the session")
        await wait_for_answer(b, "first task")
        # The next run resumes the session: the same command runs, nobody is asked.
        await b.slack.post_message(peer.ALICE, "second task")
        await wait_for_answer(b, "second task")
        assert len(await requests(b)) == 1
    assert [t["command"] for t in tool_log(tmp_path)] == ["echo hello", "echo hello"]
    with sqlite3.connect(tmp_path / "chatbridge.db") as db:
        kept = db.execute("select scope, effect, rule, created_by from tool_rules").fetchall()
        decided = db.execute("select number, state, reason from approvals").fetchall()
    assert kept == [("session", "allow", "Bash(echo hello)", peer.BOB)]
    assert decided == [
        (1, "allowed_session", ""),
        (2, "allowed", "allowed by rule 1 (Bash(echo hello))"),
    ]
    assert not (tmp_path / ".claude").exists()

"""Tool requests under stress, through the whole service (console room, fake claude asking
for each tool): a request claude withdraws, an answer racing another, a request of a run
that ended, "allow for this session", the words of ``!deny``, an approver who may not
start runs, ``!status``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest

from bridge.config import load_settings
from bridge.store.base import Approval, ApprovalAsk, ApprovalState, Store
from tests.bridge.harness import ConsoleSession, rows, write_config
from tests.bridge.live_runs import APPROVING, WAIT_S, gated, session, until_tool_runs
from tests.config_files import Table
from tests.fakes.fake_claude import tool_log

pytestmark = pytest.mark.slow


def journal_in(state_dir: Path) -> list[dict[str, Any]]:
    """What the bridge wrote to claude's stdin, from the runs' journals (``in`` records)."""
    written = []
    for journal in state_dir.rglob("journal"):
        data = journal.read_bytes()
        at = 0
        while (end := data.find(b"\n", at)) >= 0:
            head = json.loads(data[at:end])
            at = end + 1 + int(head.get("n", 0))
            if head["t"] == "in":
                payload = data[end + 1 : at]
                written += [json.loads(line) for line in payload.splitlines() if line.strip()]
    return written


async def test_a_request_claude_withdrew_is_no_longer_answered_in_place_of_the_next(
    tmp_path: Path,
) -> None:
    # interrupt mode: a new message ends the turn; claude withdraws the request it waits
    # on (control_cancel_request) and asks again in the new turn.
    config: Table = {
        "defaults": {"approve_tools": True, "during_run": "interrupt"},
        "dispatcher": {"coalesce_ms": 50, "max_wait_ms": 500},
    }
    async with asyncio.timeout(WAIT_S), session(tmp_path, config) as bridge:
        bridge.send("first job")
        await bridge.wait_for("(request `#1`")
        bridge.send("do this instead")
        await bridge.wait_for("(request `#2`")
        await bridge.wait_for("Request `#1` (`Bash`): cancelled")
        bridge.send("!approve")  # the oldest waiting request: #2, not the withdrawn #1
        await bridge.wait_for("Request `#2` (`Bash`): allowed")
        await bridge.wait_for("\ndo this instead\n")  # the answer
    assert [t["command"] for t in tool_log(tmp_path)] == ["echo hello"]
    states = rows(tmp_path, "select number, state from approvals order by number")
    assert states == [(1, ApprovalState.CANCELLED.value), (2, ApprovalState.ALLOWED.value)]


def answers_sent(state_dir: Path) -> list[dict[str, Any]]:
    """The control_responses to claude's permission requests in the journals' ``in`` records."""
    return [
        o["response"]
        for o in journal_in(state_dir)
        if o.get("type") == "control_response" and "behavior" in o["response"].get("response", {})
    ]


async def test_allow_for_the_session_sends_the_input_alone_and_racing_answers_send_one(
    tmp_path: Path,
) -> None:
    async with asyncio.timeout(WAIT_S), session(tmp_path, APPROVING, **gated(tmp_path)) as bridge:
        bridge.send("build it")
        await bridge.wait_for("(request `#1`")
        # Two answers at once (as a button and a command would race): one reaches claude.
        bridge.send("!approve session #1")
        bridge.send("!deny #1 changed my mind")
        await bridge.wait_for("Already answered")
        await until_tool_runs(bridge, tmp_path)
        # (Read while the run goes on: its journal goes with its end. The supervisor
        # journals what it wrote to claude just after writing it: a moment after, maybe.)
        state_dir = bridge.settings.runner.state_dir
        while not answers_sent(state_dir):
            await asyncio.sleep(0.05)
        [sent] = answers_sent(state_dir)
        (tmp_path / "gate").touch()
        await bridge.wait_for("\nbuild it\n")
    decision = sent["response"]
    assert decision["behavior"] == "allow"
    assert decision["updatedInput"] == {"command": "echo hello"}
    # claude's suggestions (a rule for its local settings file) are never sent back:
    # the session's rule is chatbridge's own, in its database.
    assert "updatedPermissions" not in decision
    [(state,)] = rows(tmp_path, "select state from approvals")
    assert state == ApprovalState.ALLOWED_SESSION.value
    kept = rows(tmp_path, "select scope, effect, rule, session_id is not null from tool_rules")
    assert kept == [("session", "allow", "Bash(echo hello)", 1)]


async def test_status_lists_the_waiting_request_and_deny_takes_its_id_and_whole_reason(
    tmp_path: Path,
) -> None:
    async with asyncio.timeout(WAIT_S), session(tmp_path, APPROVING) as bridge:
        bridge.send("first")
        await bridge.wait_for("(request `#1`")
        bridge.send("!approve")
        await bridge.wait_for("\nfirst\n")
        bridge.send("second")
        await bridge.wait_for("(request `#2`")
        bridge.send("!status")
        out = await bridge.wait_for("Tool requests waiting")
        assert "- `#2` `Bash`, asked" in out
        assert "- `#1`" not in out
        bridge.send("!deny #2 reason with #3 in it")
        await bridge.wait_for("\nsecond\n")
    states = rows(tmp_path, "select number, state, reason from approvals order by number")
    assert states == [
        (1, ApprovalState.ALLOWED.value, ""),
        (2, ApprovalState.DENIED.value, "reason with #3 in it"),
    ]
    assert [t["command"] for t in tool_log(tmp_path)] == ["echo hello"]


class SlowAsking:
    """A store whose ``add_approval`` commits only after ``delay_s``, whatever happens to
    its caller meanwhile (a commit under way in the database's thread is not undone by
    cancelling the task that waits for it)."""

    def __init__(self, inner: Store, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def add_approval(self, ask: ApprovalAsk) -> Approval:
        async def later() -> Approval:
            await asyncio.sleep(self.delay_s)
            return await self.inner.add_approval(ask)

        return await asyncio.shield(asyncio.ensure_future(later()))


async def test_a_request_still_being_asked_when_its_run_ends_is_cancelled_with_it(
    tmp_path: Path,
) -> None:
    # A stop just as claude asks: the run ends before the request is posted. Left
    # pending, it would be listed by !status and taken by the next !approve.
    path = write_config(tmp_path, APPROVING, env={"FAKE_CLAUDE_ECHO": "1"})
    wrap = lambda store: cast(Store, SlowAsking(store, 3.0))  # noqa: E731
    async with asyncio.timeout(WAIT_S), ConsoleSession(load_settings(path), wrap_store=wrap) as b:
        b.send("risky")
        await b.wait_for("Bash: echo hello")  # claude announced the tool, and asks
        b.send("!stop")
        await b.wait_for("Stopped")
        # Its record lands (3 s late) and the run's end then cancels it (a store row:
        # nothing to await on). An !approve before that would still take it.
        cancelled = [(ApprovalState.CANCELLED.value,)]
        while rows(tmp_path, "select state from approvals") != cancelled:
            await asyncio.sleep(0.02)
        b.send("!approve")
        await b.wait_for("No tool request is waiting.")
    assert rows(tmp_path, "select state from approvals") == [(ApprovalState.CANCELLED.value,)]

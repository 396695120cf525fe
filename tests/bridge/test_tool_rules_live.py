"""Rules kept while a request waits decide it (console room, fake claude asking for its
tool): claude need not wait for an answer a rule already gives."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.store.base import ApprovalState
from tests.bridge.harness import rows
from tests.bridge.live_runs import APPROVING, WAIT_S, session
from tests.fakes.fake_claude import tool_log

pytestmark = pytest.mark.slow


async def test_a_rule_kept_while_a_request_waits_decides_it(tmp_path: Path) -> None:
    async with asyncio.timeout(WAIT_S), session(tmp_path, APPROVING) as bridge:
        bridge.send("build it")
        await bridge.wait_for("(request `#1`")
        bridge.send("!rules allow Bash(echo hello:*)")
        await bridge.wait_for("Request `#1` (`Bash`): allowed.")
        await bridge.wait_for("\nbuild it\n")
    assert [t["command"] for t in tool_log(tmp_path)] == ["echo hello"]
    [(state, decided_by, reason)] = rows(
        tmp_path, "select state, decided_by, reason from approvals"
    )
    assert (state, decided_by) == (ApprovalState.ALLOWED.value, None)
    assert reason == "allowed by rule 1 (Bash(echo hello:*))"


async def test_a_deny_rule_kept_while_a_request_waits_denies_it(tmp_path: Path) -> None:
    async with asyncio.timeout(WAIT_S), session(tmp_path, APPROVING) as bridge:
        bridge.send("build it")
        await bridge.wait_for("(request `#1`")
        bridge.send("!rules deny Bash")
        await bridge.wait_for("Request `#1` (`Bash`): denied")
        await bridge.wait_for("\nbuild it\n")
    assert tool_log(tmp_path) == []
    [(state,)] = rows(tmp_path, "select state from approvals")
    assert state == ApprovalState.DENIED.value


async def test_a_rule_never_lets_an_approver_allow_their_own_run_when_asked_not_to(
    tmp_path: Path,
) -> None:
    # require_other_approver: nobody approves what they asked for themselves, not by
    # keeping a rule that covers it either (now or in a later request of the run).
    config = {"defaults": {"approve_tools": True, "require_other_approver": True}}
    async with asyncio.timeout(WAIT_S), session(tmp_path, config) as bridge:
        bridge.send("my own job")
        await bridge.wait_for("(request `#1`")
        bridge.send("!rules allow Bash(echo hello:*)")
        await bridge.wait_for("Kept rule `1`")
        bridge.send("!rules")
        await bridge.wait_for("- `1` allow")
        bridge.send("!stop")
        await bridge.wait_for("cancelled: the run ended")
    assert tool_log(tmp_path) == []
    [(state,)] = rows(tmp_path, "select state from approvals")
    assert state == ApprovalState.CANCELLED.value


async def test_an_approver_who_is_not_an_allowed_user_manages_rules(tmp_path: Path) -> None:
    # They may keep a room rule by `!approve always`: they must be able to list and
    # revoke it, and keep one by `!rules`, as the docs say approvers do.
    config = {"defaults": {"allowed_users": ["someone-else"], "approvers": ["local"]}}
    async with asyncio.timeout(WAIT_S), session(tmp_path, config) as bridge:
        bridge.send("!rules allow Bash(echo hello:*)")
        await bridge.wait_for("Kept rule `1`")
        bridge.send("!rules")
        await bridge.wait_for("- `1` allow")
        bridge.send("!rules revoke 1")
        await bridge.wait_for("is revoked")
    assert [
        a for (a,) in rows(tmp_path, "select action from audit where action like 'rule_%'")
    ] == [
        "rule_added",
        "rule_revoked",
    ]

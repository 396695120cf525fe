"""A rule revoked while a request is being checked against it decides nothing: the room,
told "such requests are asked again", is asked (docs/live-runs.md, Tool rules)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from bridge.core.model import UserId
from bridge.live.approval_flow import ApprovalFlow
from bridge.live.registry import LiveRuns
from bridge.outbound.replies import Replier
from bridge.store.base import (
    Approval,
    ApprovalDecision,
    ApprovalState,
    NewRule,
    RuleEffect,
    RuleScope,
)
from bridge.store.memory import MemoryStore
from tests.bridge.approval_posts import RUN, Asking

BOB = UserId("bob")


class RevokedMeanwhile(MemoryStore):
    """``!rules revoke`` lands after the rules were read, before the request is decided."""

    async def decide_approval(self, approval: Approval, decision: ApprovalDecision) -> bool:
        for rule in await self.active_rules(approval.room, None):
            await self.revoke_rule(approval.room, rule.id, BOB, 50.0)
        return await super().decide_approval(approval, decision)


async def test_a_rule_revoked_while_a_request_is_checked_does_not_decide_it(
    tmp_path: Path,
) -> None:
    asking = Asking(tmp_path)
    store = RevokedMeanwhile()
    asking.flow = ApprovalFlow(
        asking.flow.settings, store, cast(Replier, asking.posting), LiveRuns(), lambda _v: None
    )
    await store.add_rule(
        NewRule(
            asking.key,
            scope=RuleScope.ROOM,
            effect=RuleEffect.ALLOW,
            rule="Bash(ls)",
            session_id=None,
            created_by=BOB,
            at=1.0,
        )
    )
    await asking.flow.ask(RUN, asking.batch, asking.asked)
    [approval] = await store.pending_approvals()
    assert approval.state is ApprovalState.PENDING
    assert asking.posting.posted.is_set()  # the room is asked

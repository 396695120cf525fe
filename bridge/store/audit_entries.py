"""The audit row each step of a store writes, said once for every store.

:mod:`bridge.store.memory` appends these entries, :mod:`bridge.store.sql` inserts them:
which action, whose, about what, with which detail is decided here, so the contract
suite checks one set of rows rather than two copies of them (docs/operations.md,
"How the store writes").
"""

from __future__ import annotations

from bridge.core.model import InboundMessage, MessageId, RoomKey, RunId, UserId
from bridge.store.base import (
    Approval,
    ApprovalDecision,
    ApprovalState,
    AuditAction,
    AuditEntry,
    RunEnding,
    ToolRule,
)
from bridge.store.rules import APPROVAL_ACTIONS, RULE_LIMIT_BYTES, excerpt


def accepted(msg: InboundMessage, at: float, message_id: MessageId) -> AuditEntry:
    """A message accepted: its sender acted."""
    room, actor = msg.room, msg.sender
    return AuditEntry(AuditAction.MESSAGE_ACCEPTED, at, room, actor, message_id)


def ignored(msg: InboundMessage, reason: str, at: float) -> AuditEntry:
    """A message not accepted: why, and which one, never its text."""
    detail = f"{reason} (external id {msg.external_id})"
    return AuditEntry(AuditAction.MESSAGE_IGNORED, at, msg.room, msg.sender, detail=detail)


def message_step(
    action: AuditAction,
    room: RoomKey,
    message_id: MessageId,
    actor: UserId | None,
    at: float,
    *,
    run_id: RunId | None = None,
) -> AuditEntry:
    """A message edited, deleted or dropped by someone (or by the bridge: no actor)."""
    return AuditEntry(action, at, room, actor, message_id, run_id)


def dispatched(
    run_id: RunId, room: RoomKey, message_id: MessageId, at: float, detail: str = ""
) -> AuditEntry:
    """A message went into a run (``detail``: :data:`~bridge.store.base.STEERED` if steered)."""
    action = AuditAction.MESSAGE_DISPATCHED
    return AuditEntry(action, at, room, message_id=message_id, run_id=run_id, detail=detail)


def run_started(run_id: RunId, room: RoomKey, messages: int, at: float) -> AuditEntry:
    """A run started with ``messages`` messages."""
    detail = f"{messages} message(s)"
    return AuditEntry(AuditAction.RUN_STARTED, at, room, run_id=run_id, detail=detail)


def run_finished(ending: RunEnding, room: RoomKey) -> AuditEntry:
    """A run ended (detail: its status)."""
    run_id, detail = ending.run_id, ending.report.status.value
    return AuditEntry(AuditAction.RUN_FINISHED, ending.at, room, run_id=run_id, detail=detail)


def _approval_detail(approval: Approval, state: ApprovalState, reason: str = "") -> str:
    """Which request, which tool, what became of it."""
    detail = f"#{approval.number} {approval.tool_name} {state.value}"
    return f"{detail}: {reason}" if reason else detail


def approval_asked(approval: Approval) -> AuditEntry:
    """A request recorded, pending."""
    detail = _approval_detail(approval, ApprovalState.PENDING)
    at, room, run_id = approval.asked_at, approval.room, approval.run_id
    return AuditEntry(AuditAction.APPROVAL_ASKED, at, room, run_id=run_id, detail=detail)


def approval_decided(approval: Approval, decision: ApprovalDecision) -> AuditEntry:
    """A request decided, or cancelled (nobody decided: no actor)."""
    state, by, at = decision.state, decision.decided_by, decision.decided_at
    detail = _approval_detail(approval, state, decision.reason)
    action, room = APPROVAL_ACTIONS[state], approval.room
    return AuditEntry(action, at, room, by, run_id=approval.run_id, detail=detail)


def _rule_entry(action: AuditAction, rule: ToolRule, actor: UserId, at: float) -> AuditEntry:
    """Which rule, of what scope, what it says (bounded as the rule is)."""
    detail = f"rule {rule.id} {rule.scope.value} {rule.effect.value} {rule.rule}"
    return AuditEntry(action, at, rule.room, actor, detail=excerpt(detail, RULE_LIMIT_BYTES))


def rule_added(rule: ToolRule) -> AuditEntry:
    """A rule kept, by whoever made it."""
    return _rule_entry(AuditAction.RULE_ADDED, rule, rule.created_by, rule.created_at)


def rule_revoked(rule: ToolRule) -> AuditEntry:
    """A rule ended (``rule`` as revoked)."""
    if rule.revoked_by is None or rule.revoked_at is None:
        raise ValueError(f"rule {rule.id} is not revoked")
    return _rule_entry(AuditAction.RULE_REVOKED, rule, rule.revoked_by, rule.revoked_at)

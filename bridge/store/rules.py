"""Semantics every store implementation shares, kept in one place.

Both :mod:`bridge.store.memory` and :mod:`bridge.store.sql` use these helpers,
so the contract suite checks one set of rules rather than two copies of them.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from bridge.core.model import MessageState, RunReport, RunStatus, SessionId
from bridge.store.base import (
    ApprovalState,
    AuditAction,
    RuleScope,
    RunEnding,
    StoreError,
)

EXCERPT_LIMIT_BYTES = 4096
"""Upper bound, in UTF-8 bytes, of the result and error text kept per run."""

TRUNCATION_MARK = "\n…[truncated]"

LIVE_STATES = frozenset({MessageState.PENDING, MessageState.DISPATCHED})
"""Messages in these states still have work ahead: ``!stop`` may drop them and
``prune`` never deletes them."""


def excerpt(text: str, limit: int = EXCERPT_LIMIT_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, marked when it was cut.

    The head is kept: Claude's answer and a process's first error line are
    what an operator reads first.
    """
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    room = limit - len(TRUNCATION_MARK.encode())
    # errors="ignore" drops a multi-byte character split by the cut.
    return encoded[:room].decode(errors="ignore") + TRUNCATION_MARK


def kept_report(report: RunReport) -> RunReport:
    """``report`` as a store keeps it: its result and error cut to :func:`excerpt`."""
    return replace(report, result_text=excerpt(report.result_text), error=excerpt(report.error))


def require_storable(text: str) -> None:
    """Raise :class:`StoreError` for text no database can store (a lone surrogate).

    What the SQL drivers do on their own; the memory store calls it so the
    contract holds there too. Callers make text safe before it gets here
    (:func:`bridge.core.text.safe_text`): this is the last line.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise StoreError(f"text the database cannot store: {exc.reason}") from exc


def settled_state(ending: RunEnding) -> MessageState:
    """The state the run's still-dispatched messages take as it ends: pending again
    for a run that never began (``requeue``), else as :func:`finished_message_state`."""
    return MessageState.PENDING if ending.requeue else finished_message_state(ending.report.status)


def finished_message_state(status: RunStatus) -> MessageState:
    """The state a run's dispatched messages take when the run ends this way.

    A stopped run's messages become ``dropped``: ``!stop`` dropped them on
    purpose, so they are neither done nor failed (and not retryable).
    """
    if status is RunStatus.RUNNING:
        raise ValueError("a run cannot finish with status 'running'")
    if status is RunStatus.SUCCEEDED:
        return MessageState.DONE
    if status is RunStatus.STOPPED:
        return MessageState.DROPPED
    return MessageState.FAILED


def delivery_key() -> str:
    """A new outbox entry's idempotency key: unique, and short enough for every transport."""
    return f"cb-{secrets.token_hex(12)}"


APPROVAL_ACTIONS = {
    ApprovalState.ALLOWED: AuditAction.APPROVAL_ALLOWED,
    ApprovalState.ALLOWED_SESSION: AuditAction.APPROVAL_ALLOWED,
    ApprovalState.DENIED: AuditAction.APPROVAL_DENIED,
    ApprovalState.EXPIRED: AuditAction.APPROVAL_EXPIRED,
    ApprovalState.CANCELLED: AuditAction.APPROVAL_CANCELLED,
}
"""The audit action recording a request's end in each state."""

DECISIONS = frozenset(APPROVAL_ACTIONS)
"""What ``decide_approval`` may set: every end, cancelled included (claude withdrew one
request); a run's end cancels all of its at once (``cancel_approvals``)."""

_REASON_LIMIT_BYTES = 1024


def require_decision(state: ApprovalState) -> None:
    """Refuse a state ``decide_approval`` does not set: a caller's bug, not data."""
    if state not in DECISIONS:
        raise ValueError(f"an approval cannot be decided as {state.value!r}")


def approval_reason(reason: str) -> str:
    """The reason as kept: bounded, like every other free text the store keeps."""
    return excerpt(reason, _REASON_LIMIT_BYTES)


RULE_LIMIT_BYTES = 4096
"""Upper bound of a kept rule's text (a long command, exactly)."""


def require_rule(scope: RuleScope, session_id: SessionId | None, rule: str) -> None:
    """Refuse a rule no store keeps: a caller's bug, not data."""
    if (scope is RuleScope.SESSION) != (session_id is not None):
        raise ValueError("a session rule needs its session, a room rule takes none")
    if not rule or len(rule.encode()) > RULE_LIMIT_BYTES:
        raise ValueError("a rule's text is empty or too long")

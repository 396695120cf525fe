"""Row mappers of the SQL store: stored rows to the store's records, and records to row values.

Pure functions, no session: what each table's columns mean is said once, here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bridge.core.model import (
    Attachment,
    ExternalMessageId,
    InboundMessage,
    LiveRun,
    Message,
    MessageId,
    MessageState,
    Reply,
    ReplyKind,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
    SessionId,
    UserId,
)
from bridge.store.base import (
    Approval,
    ApprovalAsk,
    ApprovalDecision,
    ApprovalState,
    AuditAction,
    AuditEntry,
    AuditRecord,
    DeliveryState,
    LimitResume,
    OutboxEntry,
    RegisteredRun,
    RuleEffect,
    RuleScope,
    RunRecord,
    ToolRule,
)
from bridge.store.keys import room_key as _room
from bridge.store.keys import stored_id as _stored_id
from bridge.store.rules import delivery_key
from bridge.store.tables import (
    ApprovalRow,
    AuditRow,
    LimitResumeRow,
    LiveRunRow,
    MessageRow,
    OutboxRow,
    RunRow,
    ToolRuleRow,
)


def message_values(msg: InboundMessage, received_at: float) -> dict[str, Any]:
    return {
        "transport": msg.room.transport,
        "room_id": _stored_id(msg.room),
        "external_id": msg.external_id,
        "sender": msg.sender,
        "text": msg.text,
        "thread": msg.thread,
        "received_at": received_at,
        "state": MessageState.PENDING.value,
        "attachments": attachments_json(msg.attachments),
        "sender_name": msg.sender_name,
        "reply_to_text": msg.reply_to_text,
    }


def attachments_json(attachments: Sequence[Attachment]) -> list[dict[str, Any]] | None:
    if not attachments:
        return None
    return [{"name": a.name, "mime": a.mime, "size": a.size, "ref": a.ref} for a in attachments]


def attachments_of(stored: list[dict[str, Any]] | None) -> tuple[Attachment, ...]:
    return tuple(
        Attachment(
            name=str(a["name"]),
            mime=str(a["mime"]),
            size=None if a.get("size") is None else int(a["size"]),
            ref=str(a["ref"]),
        )
        for a in stored or ()
    )


def message_key(msg: InboundMessage) -> tuple[str, str, str]:
    """What makes a message a redelivery: transport, room and external id."""
    return (msg.room.transport, _stored_id(msg.room), msg.external_id)


def audit_values(entry: AuditEntry) -> dict[str, Any]:
    """An audit row's columns (for a Core INSERT, or :func:`audit_row`)."""
    room = entry.room
    return {
        "at": entry.at,
        "action": entry.action.value,
        "transport": None if room is None else room.transport,
        "room_id": None if room is None else _stored_id(room),
        "actor": entry.actor,
        "message_id": entry.message_id,
        "run_id": entry.run_id,
        "detail": entry.detail,
    }


def audit_row(entry: AuditEntry) -> AuditRow:
    return AuditRow(**audit_values(entry))


def outbox_row(reply: Reply, at: float, run_id: RunId | None) -> OutboxRow:
    """A new, pending outbox entry, for the ORM (:func:`outbox_values`)."""
    return OutboxRow(**outbox_values(reply, at, run_id))


def session_rows(sessions: Mapping[RoomKey, SessionId | None]) -> list[dict[str, Any]]:
    """Rooms' sessions (None: forgotten), for :attr:`SqlStore._sessions_upsert` (each
    room once)."""
    return [
        {"transport": room.transport, "room_id": _stored_id(room), "session_id": session}
        for room, session in sessions.items()
    ]


def outbox_values(reply: Reply, at: float, run_id: RunId | None) -> dict[str, Any]:
    """A new, pending outbox entry, for a Core INSERT."""
    return {
        "transport": reply.room.transport,
        "room_id": _stored_id(reply.room),
        "run_id": run_id,
        "text": reply.text,
        "kind": reply.kind.value,
        "in_reply_to": reply.in_reply_to,
        "thread": reply.thread,
        "anchor": reply.anchor,
        "file": reply.file,
        "key": delivery_key(),
        "parts_done": 0,
        "attempts": 0,
        "next_attempt_at": at,
        "state": DeliveryState.PENDING.value,
        "created": at,
    }


def new_entry(values: dict[str, Any], new_id: int) -> OutboxEntry:
    """The entry just inserted with ``values`` (from :func:`outbox_values`)."""
    return to_outbox_entry(OutboxRow(id=new_id, **values))


def to_outbox_entry(row: OutboxRow) -> OutboxEntry:
    reply = Reply(
        room=_room(row.transport, row.room_id),
        text=row.text,
        kind=ReplyKind(row.kind),
        in_reply_to=None if row.in_reply_to is None else ExternalMessageId(row.in_reply_to),
        thread=row.thread,
        anchor=None if row.anchor is None else ExternalMessageId(row.anchor),
        file=row.file,
    )
    return OutboxEntry(
        id=row.id,
        reply=reply,
        key=row.key,
        parts_done=row.parts_done,
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
        state=DeliveryState(row.state),
        created=row.created,
        run_id=None if row.run_id is None else RunId(row.run_id),
    )


def to_message(row: MessageRow) -> Message:
    return Message(
        id=MessageId(row.id),
        room=_room(row.transport, row.room_id),
        sender=UserId(row.sender),
        text=row.text,
        external_id=ExternalMessageId(row.external_id),
        received_at=row.received_at,
        thread=row.thread,
        attachments=attachments_of(row.attachments),
        sender_name=row.sender_name,
        reply_to_text=row.reply_to_text,
    )


def to_run_record(row: RunRow, message_ids: tuple[MessageId, ...]) -> RunRecord:
    status = RunStatus(row.status)
    report = None
    if status is not RunStatus.RUNNING:
        report = RunReport(
            status=status,
            exit_code=row.exit_code,
            session_id=None if row.session_id is None else SessionId(row.session_id),
            cost_usd=row.cost_usd,
            num_turns=row.num_turns,
            duration_ms=row.duration_ms,
            result_text=row.result_excerpt,
            error=row.error_excerpt,
            session_not_found=row.session_not_found,
        )
    return RunRecord(
        id=RunId(row.id),
        room=_room(row.transport, row.room_id),
        status=status,
        started_at=row.started_at,
        ended_at=row.ended_at,
        pid=row.pid,
        message_ids=message_ids,
        report=report,
        replica=row.replica,
    )


def to_registered_run(row: LiveRunRow) -> RegisteredRun:
    live = LiveRun(
        run_id=RunId(row.run_id),
        supervisor_pid=row.supervisor_pid,
        supervisor_start=row.supervisor_start,
        claude_pid=row.claude_pid,
        run_dir=row.run_dir,
        host=row.host,
    )
    return RegisteredRun(
        live=live,
        room=_room(row.transport, row.room_id),
        delivered_offset=row.delivered_offset,
        registered_at=row.registered_at,
    )


def to_audit_record(row: AuditRow) -> AuditRecord:
    room = None
    if row.transport is not None and row.room_id is not None:
        room = _room(row.transport, row.room_id)
    return AuditRecord(
        action=AuditAction(row.action),
        at=row.at,
        room=room,
        actor=None if row.actor is None else UserId(row.actor),
        message_id=None if row.message_id is None else MessageId(row.message_id),
        run_id=None if row.run_id is None else RunId(row.run_id),
        detail=row.detail,
        id=row.id,
    )


def approval_values(ask: ApprovalAsk, number: int) -> dict[str, Any]:
    """A new, pending request under the room's ``number``, for an INSERT."""
    return {
        "transport": ask.room.transport,
        "room_id": _stored_id(ask.room),
        "number": number,
        "run_id": ask.run_id,
        "request_id": ask.request_id,
        "tool_name": ask.tool_name,
        "input_json": ask.input_json,
        "asked_at": ask.asked_at,
        "expires_at": ask.expires_at,
        "state": ApprovalState.PENDING.value,
        "reason": "",
        "shown_digest": ask.shown_digest,
    }


def decision_values(decision: ApprovalDecision) -> dict[str, Any]:
    """A request's columns as ``decision`` ends it, for an UPDATE."""
    return {
        "state": decision.state.value,
        "decided_by": decision.decided_by,
        "decided_at": decision.decided_at,
        "reason": decision.reason,
    }


def to_approval(row: ApprovalRow) -> Approval:
    return Approval(
        id=row.id,
        room=_room(row.transport, row.room_id),
        number=row.number,
        run_id=RunId(row.run_id),
        request_id=row.request_id,
        tool_name=row.tool_name,
        input_json=row.input_json,
        asked_at=row.asked_at,
        expires_at=row.expires_at,
        message_id=None if row.message_id is None else ExternalMessageId(row.message_id),
        state=ApprovalState(row.state),
        decided_by=None if row.decided_by is None else UserId(row.decided_by),
        decided_at=row.decided_at,
        reason=row.reason,
        shown_digest=row.shown_digest,
    )


def to_tool_rule(row: ToolRuleRow) -> ToolRule:
    return ToolRule(
        id=row.id,
        room=_room(row.transport, row.room_id),
        scope=RuleScope(row.scope),
        session_id=None if row.session_id is None else SessionId(row.session_id),
        effect=RuleEffect(row.effect),
        rule=row.rule,
        created_by=UserId(row.created_by),
        created_at=row.created_at,
        revoked_by=None if row.revoked_by is None else UserId(row.revoked_by),
        revoked_at=row.revoked_at,
    )


def to_limit_resume(row: LimitResumeRow) -> LimitResume:
    return LimitResume(RunId(row.run_id), _room(row.transport, row.room_id), row.resets_at)

"""An in-process :class:`~bridge.store.base.Store` for fast unit tests.

Nothing survives the process. It follows the same rules as the SQL store
(the contract suite runs against both), and every method completes without
awaiting, so each one is atomic with respect to other tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    LiveRun,
    Message,
    MessageId,
    MessageState,
    Reply,
    RoomKey,
    RunId,
    RunStatus,
    SessionId,
    TransportName,
    UserId,
)
from bridge.store import audit_entries
from bridge.store.base import (
    STEERED,
    WHOLE_TRAIL,
    Approval,
    ApprovalAsk,
    ApprovalDecision,
    ApprovalState,
    AuditAction,
    AuditEntry,
    AuditFilter,
    AuditRecord,
    DeliveryState,
    Fence,
    LimitResume,
    NewRule,
    OutboxEntry,
    RegisteredRun,
    RoomOverrides,
    RuleScope,
    RunEnding,
    RunRecord,
    SessionTranscript,
    StoreError,
    ToolRule,
    TranscriptStamp,
)
from bridge.store.keys import stored_id
from bridge.store.rules import (
    LIVE_STATES,
    approval_reason,
    delivery_key,
    kept_report,
    require_decision,
    require_rule,
    require_storable,
    settled_state,
)

_DedupKey = tuple[RoomKey, ExternalMessageId]
_KeyT = TypeVar("_KeyT")
_RecordT = TypeVar("_RecordT")


@dataclass(slots=True)
class _StoredMessage:
    message: Message
    state: MessageState
    run_id: RunId | None = None


class MemoryStore:
    """The store's rules over plain dictionaries."""

    def __init__(self) -> None:
        """An empty store."""
        self._messages: dict[MessageId, _StoredMessage] = {}
        self._seen: set[_DedupKey] = set()
        # Insertion order is start order, as ``seq`` is in the SQL store.
        self._runs: dict[RunId, RunRecord] = {}
        self._live: dict[RunId, RegisteredRun] = {}
        self._sessions: dict[RoomKey, SessionId] = {}
        # The conversation's stored transcript (of any session).
        self._transcripts: dict[RoomKey, SessionTranscript] = {}
        self._overrides: dict[RoomKey, RoomOverrides] = {}
        # By id, which is asking order; numbers count per room and never go back.
        self._approvals: dict[int, Approval] = {}
        self._last_number: dict[RoomKey, int] = {}
        self._schedule_marks: dict[str, float] = {}
        self._seen_marks: dict[RoomKey, tuple[ExternalMessageId, float]] = {}
        self._next_approval = 1
        self._rules: dict[int, ToolRule] = {}
        self._audit: list[AuditRecord] = []
        self._outbox: dict[int, OutboxEntry] = {}
        # The budget ledger: (room, ended at, cost) by run.
        self._spend: dict[RunId, tuple[RoomKey, float, float]] = {}
        self._resumes: dict[RunId, LimitResume] = {}
        self._next_outbox = 1
        self._next_message = 1
        self._next_audit = 1
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    def _write_audit(self, entry: AuditEntry) -> None:
        self._audit.append(entry.recorded(self._next_audit))
        self._next_audit += 1

    # Messages

    async def accept(self, msg: InboundMessage, received_at: float) -> Message | None:
        """Record ``msg`` as pending and audit it, or return None on redelivery."""
        self._check_open()
        require_storable(msg.text)
        key = (msg.room, msg.external_id)
        # Ids are not dense: like the SQL stores (whose sequences advance on
        # every insert attempt), a redelivery uses one up.
        message_id = MessageId(self._next_message)
        self._next_message += 1
        if key in self._seen:
            return None
        self._seen.add(key)
        message = msg.accepted(message_id, received_at)
        self._messages[message.id] = _StoredMessage(message, MessageState.PENDING)
        self._write_audit(audit_entries.accepted(msg, received_at, message.id))
        return message

    async def record_ignored(self, msg: InboundMessage, reason: str, at: float) -> None:
        """Audit a message that was not accepted, without its text."""
        self._check_open()
        self._write_audit(audit_entries.ignored(msg, reason, at))

    async def complete_command(self, message_id: MessageId) -> None:
        """Mark a pending command message done: commands never go into a run."""
        self._check_open()
        stored = self._messages.get(message_id)
        if stored is not None and stored.state is MessageState.PENDING:
            stored.state = MessageState.DONE

    async def pending_messages(self, room: RoomKey | None = None) -> list[Message]:
        """Every pending message (or ``room``'s), in acceptance order."""
        self._check_open()
        return [
            m.message
            for _, m in sorted(self._messages.items())
            if m.state is MessageState.PENDING and room in (None, m.message.room)
        ]

    async def mark_dropped(self, ids: Sequence[MessageId], actor: UserId | None, at: float) -> None:
        """Drop the pending or dispatched ones of these messages, one audit row each."""
        self._check_open()
        for stored in self._existing(ids):
            if stored.state not in LIVE_STATES:
                continue
            stored.state = MessageState.DROPPED
            message = stored.message
            self._write_audit(
                audit_entries.message_step(
                    AuditAction.MESSAGE_DROPPED,
                    message.room,
                    message.id,
                    actor,
                    at,
                    run_id=stored.run_id,
                )
            )

    async def pending_message(
        self, room: RoomKey, external_id: ExternalMessageId
    ) -> Message | None:
        """The pending message with this transport id in ``room``, or None."""
        self._check_open()
        for stored in self._messages.values():
            message = stored.message
            if (message.room.channel, message.external_id) == (room.channel, external_id):
                return message if stored.state is MessageState.PENDING else None
        return None

    async def edit_pending(
        self, message_id: MessageId, text: str, actor: UserId | None, at: float
    ) -> Message | None:
        """Replace a pending message's text and audit it; None if not pending or unchanged."""
        stored = self._pending(message_id)
        if stored is None or stored.message.text == text:
            return None
        stored.message = replace(stored.message, text=text)
        return self._changed(stored, AuditAction.MESSAGE_EDITED, actor, at)

    async def delete_pending(
        self, message_id: MessageId, actor: UserId | None, at: float
    ) -> Message | None:
        """Drop a pending message that was deleted and audit it; None if not pending."""
        stored = self._pending(message_id)
        if stored is None:
            return None
        stored.state = MessageState.DROPPED
        return self._changed(stored, AuditAction.MESSAGE_DELETED, actor, at)

    def _pending(self, message_id: MessageId) -> _StoredMessage | None:
        self._check_open()
        stored = self._messages.get(message_id)
        return stored if stored is not None and stored.state is MessageState.PENDING else None

    def _changed(
        self, stored: _StoredMessage, action: AuditAction, actor: UserId | None, at: float
    ) -> Message:
        message = stored.message
        self._write_audit(audit_entries.message_step(action, message.room, message.id, actor, at))
        return message

    async def messages(self, ids: Sequence[MessageId]) -> list[Message]:
        """The messages with these ids that exist, in acceptance order."""
        self._check_open()
        return [s.message for s in self._existing(ids)]

    def _existing(self, ids: Sequence[MessageId]) -> list[_StoredMessage]:
        return [self._messages[i] for i in sorted(set(ids)) if i in self._messages]

    async def message_states(self, ids: Sequence[MessageId]) -> dict[MessageId, MessageState]:
        """The state of each of these messages that exists (not in the protocol)."""
        self._check_open()
        return {s.message.id: s.state for s in self._existing(ids)}

    # Runs

    async def start_run(
        self, run_id: RunId, batch: Batch, at: float, fence: Fence | None = None
    ) -> None:
        """Record a running run, dispatch its messages into it, audit both.

        No replicas share a memory store: a ``fence`` is never checked."""
        self._check_open()
        if run_id in self._runs:
            raise StoreError(f"run {run_id} exists already")
        missing = [i for i in batch.ids if i not in self._messages]
        if missing:
            raise StoreError(f"run {run_id}: messages {missing} do not exist")
        self._runs[run_id] = RunRecord(
            id=run_id,
            room=batch.room,
            status=RunStatus.RUNNING,
            started_at=at,
            ended_at=None,
            pid=None,
            message_ids=batch.ids,
            report=None,
            replica=None if fence is None else fence.replica,
        )
        self._dispatch_into(run_id, batch, at)
        self._write_audit(audit_entries.run_started(run_id, batch.room, len(batch.ids), at))

    async def steer_into_run(self, run_id: RunId, batch: Batch, at: float) -> None:
        """Add messages sent into a running run's session to that run."""
        self._check_open()
        run = self._runs.get(run_id)
        if run is None or run.status is not RunStatus.RUNNING:
            raise StoreError(f"run {run_id} is not running")
        missing = [i for i in batch.ids if i not in self._messages]
        if missing:
            raise StoreError(f"run {run_id}: messages {missing} do not exist")
        self._runs[run_id] = replace(run, message_ids=run.message_ids + batch.ids)
        self._dispatch_into(run_id, batch, at, detail=STEERED)

    def _dispatch_into(self, run_id: RunId, batch: Batch, at: float, detail: str = "") -> None:
        """The batch's messages go into the run, one ``message_dispatched`` row each."""
        for message_id in batch.ids:
            stored = self._messages[message_id]
            stored.state = MessageState.DISPATCHED
            stored.run_id = run_id
            self._write_audit(audit_entries.dispatched(run_id, batch.room, message_id, at, detail))

    async def register_live_run(self, live: LiveRun, at: float) -> None:
        """Record (or replace) where the run's supervisor is, and claude's pid."""
        run = self._run(live.run_id)
        if run.status is not RunStatus.RUNNING:
            raise StoreError(f"run {live.run_id} is not running")
        previous = self._live.get(live.run_id)
        # A reattach keeps what the room was already shown.
        offset = 0 if previous is None else previous.delivered_offset
        self._runs[live.run_id] = replace(run, pid=live.claude_pid)
        self._live[live.run_id] = RegisteredRun(live, run.room, offset, at)

    async def unregister_live_run(self, run_id: RunId) -> None:
        """Take a running run out of the registry and forget its pid."""
        self._check_open()
        run = self._runs.get(run_id)
        if run is None or run.status is not RunStatus.RUNNING:
            return
        self._live.pop(run_id, None)
        self._runs[run_id] = replace(run, pid=None)

    async def live_runs(self) -> list[RegisteredRun]:
        """Every registered run, oldest registration first, then in start order."""
        self._check_open()
        started = {run_id: position for position, run_id in enumerate(self._runs)}
        return sorted(self._live.values(), key=lambda r: (r.registered_at, started[r.live.run_id]))

    async def set_delivered_offset(self, run_id: RunId, offset: int) -> None:
        """Raise the run's delivered offset; ignored for a run not in the registry."""
        self._check_open()
        registered = self._live.get(run_id)
        if registered is not None and offset > registered.delivered_offset:
            self._live[run_id] = replace(registered, delivered_offset=offset)

    async def finish_run(self, ending: RunEnding) -> list[OutboxEntry]:
        """Record how a run ended, settle its still-dispatched messages, enqueue ``replies``."""
        run_id, report, at, replies = ending.run_id, ending.report, ending.at, ending.replies
        state = settled_state(ending)
        run = self._run(run_id)
        if run.status is not RunStatus.RUNNING:
            # A retry whose first try committed: hand back what is still to deliver.
            # (Its registry row went with the first try.)
            return [
                e
                for e in self._outbox.values()
                if e.run_id == run_id and e.state is DeliveryState.PENDING
            ]
        # Checked before anything changes: the method stays atomic.
        for text in (report.result_text, report.error, *(r.text for r in replies)):
            require_storable(text)
        kept = kept_report(report)
        self._runs[run_id] = replace(run, status=report.status, ended_at=at, report=kept)
        self._live.pop(run_id, None)
        for stored in self._messages.values():
            if stored.run_id == run_id and stored.state is MessageState.DISPATCHED:
                stored.state = state
        self._write_audit(audit_entries.run_finished(ending, run.room))
        if ending.keep_session and report.session_id is not None:
            self._sessions[run.room] = report.session_id
        if report.cost_usd is not None:
            self._spend[run_id] = (run.room, at, report.cost_usd)
        return self._enqueue(replies, at, run_id)

    # Outbox

    def _enqueue(
        self, replies: Sequence[Reply], at: float, run_id: RunId | None
    ) -> list[OutboxEntry]:
        entries = []
        for reply in replies:
            entry = OutboxEntry(
                id=self._next_outbox,
                reply=reply,
                key=delivery_key(),
                parts_done=0,
                attempts=0,
                next_attempt_at=at,
                state=DeliveryState.PENDING,
                created=at,
                run_id=run_id,
            )
            self._next_outbox += 1
            self._outbox[entry.id] = entry
            entries.append(entry)
        return entries

    async def enqueue(self, replies: Sequence[Reply], at: float) -> list[OutboxEntry]:
        """Put replies into the outbox, pending, in order."""
        self._check_open()
        for reply in replies:
            require_storable(reply.text)
        return self._enqueue(replies, at, None)

    async def enqueue_once(self, reply: Reply, key: str, at: float) -> list[OutboxEntry]:
        """Put ``reply`` into the outbox under ``key`` unless an entry has that key."""
        self._check_open()
        require_storable(reply.text)
        if any(e.key == key for e in self._outbox.values()):
            return []
        (entry,) = self._enqueue([reply], at, None)
        self._outbox[entry.id] = replace(entry, key=key)
        return [self._outbox[entry.id]]

    async def undelivered(self, room: RoomKey | None = None) -> list[OutboxEntry]:
        """Every pending outbox entry (or ``room``'s), in recording order."""
        self._check_open()
        return [
            e
            for e in self._outbox.values()
            if e.state is DeliveryState.PENDING and room in (None, e.reply.room)
        ]

    def _entry(self, entry_id: int) -> OutboxEntry:
        return self._one(self._outbox, entry_id, "outbox entry")

    async def delivery_progress(self, entry_id: int, parts_done: int) -> None:
        """Record the parts of an entry delivered so far."""
        entry = self._entry(entry_id)
        self._outbox[entry_id] = replace(entry, parts_done=max(entry.parts_done, parts_done))

    async def delivery_attempted(self, entry_id: int, next_attempt_at: float) -> None:
        """Count a failed attempt and when the next is due."""
        entry = self._entry(entry_id)
        self._outbox[entry_id] = replace(
            entry, attempts=entry.attempts + 1, next_attempt_at=next_attempt_at
        )

    async def delivery_finished(self, entry_id: int, state: DeliveryState, at: float) -> None:
        """Mark an entry delivered or failed."""
        if state is DeliveryState.PENDING:
            raise ValueError("a delivery cannot finish as pending")
        entry = self._entry(entry_id)
        self._outbox[entry_id] = replace(entry, state=state, next_attempt_at=at)

    def _run(self, run_id: RunId) -> RunRecord:
        return self._one(self._runs, run_id, "run")

    def _one(self, table: Mapping[_KeyT, _RecordT], key: _KeyT, what: str) -> _RecordT:
        """``table[key]``; a missing one is the caller's StoreError, as in the SQL store."""
        self._check_open()
        try:
            return table[key]
        except KeyError:
            raise StoreError(f"no {what} {key}") from None

    async def get_run(self, run_id: RunId) -> RunRecord | None:
        """The run with this id, or None."""
        self._check_open()
        return self._runs.get(run_id)

    async def running_runs(self) -> list[RunRecord]:
        """Runs still marked running, oldest first."""
        self._check_open()
        return [r for r in self._runs.values() if r.status is RunStatus.RUNNING]

    async def last_run(self, room: RoomKey) -> RunRecord | None:
        """The room's most recently started run."""
        self._check_open()
        return next((r for r in reversed(self._runs.values()) if r.room == room), None)

    async def room_runs(self, room: RoomKey, limit: int) -> list[RunRecord]:
        """The conversation's ``limit`` most recently started runs, newest first."""
        self._check_open()
        runs = [run for run in self._runs.values() if run.room == room]
        return runs[::-1][:limit]

    async def retryable_runs(self, room: RoomKey) -> list[RunRecord]:
        """The room's offered runs, oldest first (the rule is in the protocol)."""
        self._check_open()
        runs = [r for r in self._runs.values() if r.room == room]
        return [
            run
            for index, run in enumerate(runs)
            if run.status.retryable
            and any(
                s.run_id == run.id and s.state is MessageState.FAILED
                for s in self._messages.values()
            )
            and not any(self._supersedes(later, run) for later in runs[index + 1 :])
        ]

    def _supersedes(self, later: RunRecord, run: RunRecord) -> bool:
        ended = run.ended_at if run.ended_at is not None else run.started_at
        return later.status is RunStatus.SUCCEEDED and any(
            self._messages[i].message.received_at > ended
            for i in later.message_ids
            if i in self._messages
        )

    async def requeue_run(self, run_id: RunId) -> list[Message]:
        """Mark pending the messages that failed with this run as their last, while the
        run is offered (the rule of :meth:`retryable_runs`)."""
        self._check_open()
        run = self._runs.get(run_id)
        if run is None or run_id not in {r.id for r in await self.retryable_runs(run.room)}:
            return []
        found = [
            stored
            for _, stored in sorted(self._messages.items())
            if stored.run_id == run_id and stored.state is MessageState.FAILED
        ]
        for stored in found:
            stored.state = MessageState.PENDING
        return [s.message for s in found]

    # Sessions

    async def get_session(self, room: RoomKey) -> SessionId | None:
        """The Claude session the room resumes, if any."""
        self._check_open()
        return self._sessions.get(room)

    async def set_session(self, room: RoomKey, session_id: SessionId | None) -> None:
        """Remember (or, with None, forget) the Claude session of a room."""
        self._check_open()
        if session_id is None:
            self._sessions.pop(room, None)
            self._transcripts.pop(room, None)
        else:
            self._sessions[room] = session_id

    # Session transcripts

    async def save_transcript(self, room: RoomKey, transcript: SessionTranscript) -> None:
        """Keep the conversation's transcript in place of the one it kept."""
        self._check_open()
        self._transcripts[room] = replace(transcript, content=bytes(transcript.content))

    async def transcript_stamp(
        self, room: RoomKey, session_id: SessionId
    ) -> TranscriptStamp | None:
        """The stored transcript's stamp, if it is ``session_id``'s."""
        kept = self._transcript_of(room, session_id)
        return None if kept is None else kept.stamp

    async def load_transcript(self, room: RoomKey, session_id: SessionId) -> bytes | None:
        """The stored transcript's content, if it is ``session_id``'s."""
        kept = self._transcript_of(room, session_id)
        return None if kept is None else kept.content

    def _transcript_of(self, room: RoomKey, session_id: SessionId) -> SessionTranscript | None:
        self._check_open()
        kept = self._transcripts.get(room)
        return kept if kept is not None and kept.session_id == session_id else None

    async def drop_transcript(self, room: RoomKey) -> None:
        """Forget the conversation's stored transcript."""
        self._check_open()
        self._transcripts.pop(room, None)

    # Audit

    # Room overrides

    async def room_overrides(self, room: RoomKey) -> RoomOverrides:
        """The model and permission mode set by command for the room, if any."""
        self._check_open()
        return self._overrides.get(room, RoomOverrides())

    async def room_state(self, room: RoomKey) -> tuple[SessionId | None, RoomOverrides]:
        """The room's session and overrides."""
        return await self.get_session(room), await self.room_overrides(room)

    async def schedule_marks(self) -> dict[str, float]:
        """Each schedule's latest firing time dealt with, by name."""
        self._check_open()
        return dict(self._schedule_marks)

    async def mark_schedule(self, name: str, fired_at: float) -> None:
        """Record a firing as dealt with; marks never go back."""
        self._check_open()
        require_storable(name)
        self._schedule_marks[name] = max(fired_at, self._schedule_marks.get(name, fired_at))

    async def seen_marks(self, transport: TransportName) -> dict[RoomKey, ExternalMessageId]:
        """The newest message ``transport`` saw in each room and thread."""
        self._check_open()
        return {k: v for k, (v, _) in self._seen_marks.items() if k.transport == transport}

    async def mark_seen(self, marks: Mapping[RoomKey, ExternalMessageId], at: float) -> None:
        """Record the marks; marks never go back."""
        self._check_open()
        for room, last in marks.items():
            require_storable(stored_id(room))
            require_storable(last)
        for room, last in marks.items():
            kept = self._seen_marks.get(room)
            if kept is None or kept[0] < last:
                self._seen_marks[room] = (last, at)

    async def set_room_model(self, room: RoomKey, model: str | None) -> None:
        """Set (None: clear) the model of the room's next runs."""
        self._check_open()
        if model is not None:
            require_storable(model)
        self._overrides[room] = replace(await self.room_overrides(room), model=model)

    async def set_room_fork(self, room: RoomKey, fork: bool) -> None:
        """Whether the room's next run forks its session."""
        self._check_open()
        self._overrides[room] = replace(await self.room_overrides(room), fork=fork)

    async def set_room_mode(self, room: RoomKey, mode: str | None) -> None:
        """Set (None: clear) the permission mode of the room's next runs."""
        self._check_open()
        if mode is not None:
            require_storable(mode)
        self._overrides[room] = replace(await self.room_overrides(room), permission_mode=mode)

    # Budgets and usage limits

    async def spend(self, since: float, room: RoomKey | None = None) -> float:
        """USD the runs that ended at or after ``since`` cost (in ``room``, or everywhere)."""
        self._check_open()
        return sum(
            cost
            for spent_in, at, cost in self._spend.values()
            # By transport and room id, as the SQL columns: whatever else a key carries.
            if at >= since
            and (
                room is None
                or (spent_in.transport, spent_in.room_id) == (room.transport, room.room_id)
            )
        )

    async def add_limit_resume(self, run_id: RunId, room: RoomKey, resets_at: float) -> None:
        """Note a retry of ``run_id`` at ``resets_at`` (the first note stands)."""
        self._check_open()
        self._resumes.setdefault(run_id, LimitResume(run_id, room, resets_at))

    async def limit_resumes(self) -> list[LimitResume]:
        """The waiting retries, earliest first."""
        self._check_open()
        return sorted(self._resumes.values(), key=lambda r: (r.resets_at, r.run_id))

    async def drop_limit_resume(self, run_id: RunId) -> bool:
        """Forget the waiting retry of ``run_id``; whether there was one."""
        self._check_open()
        return self._resumes.pop(run_id, None) is not None

    async def requeue_limit_resume(self, run_id: RunId) -> list[Message] | None:
        """Forget the waiting retry and re-queue its run's messages; None if none waited."""
        self._check_open()
        if self._resumes.pop(run_id, None) is None:
            return None
        return await self.requeue_run(run_id)

    # Approvals

    async def add_approval(self, ask: ApprovalAsk) -> Approval:
        """Record a pending request under the room's next number; a replay returns the first."""
        self._check_open()
        for approval in self._approvals.values():
            if (approval.run_id, approval.request_id) == (ask.run_id, ask.request_id):
                return approval
        for text in (ask.request_id, ask.tool_name, ask.input_json):
            require_storable(text)
        number = self._last_number.get(ask.room, 0) + 1
        self._last_number[ask.room] = number
        approval = ask.pending(self._next_approval, number)
        self._next_approval += 1
        self._approvals[approval.id] = approval
        self._write_audit(audit_entries.approval_asked(approval))
        return approval

    async def set_approval_message(self, approval: Approval, message_id: ExternalMessageId) -> None:
        """Remember the room message that asks."""
        self._check_open()
        stored = self._approvals.get(approval.id)
        if stored is not None:
            self._approvals[approval.id] = replace(stored, message_id=message_id)

    async def pending_approvals(self, room: RoomKey | None = None) -> list[Approval]:
        """Pending requests, of one room or of all, oldest first."""
        self._check_open()
        return [
            a
            for a in self._approvals.values()
            if a.state is ApprovalState.PENDING and (room is None or a.room == room)
        ]

    async def approval_by_number(self, room: RoomKey, number: int) -> Approval | None:
        """The room's request with this number, whatever its state."""
        self._check_open()
        return next(
            (a for a in self._approvals.values() if a.room == room and a.number == number), None
        )

    async def approval_by_message(
        self, room: RoomKey, message_id: ExternalMessageId
    ) -> Approval | None:
        """The room's request asked by this message, whatever its state."""
        self._check_open()
        return next(
            (
                a
                for a in self._approvals.values()
                if a.room.channel == room.channel and a.message_id == message_id
            ),
            None,
        )

    async def decide_approval(self, approval: Approval, decision: ApprovalDecision) -> bool:
        """Decide the request if it is still pending (and its rule holds), audited."""
        self._check_open()
        require_decision(decision.state)
        require_storable(decision.reason)
        decision = replace(decision, reason=approval_reason(decision.reason))
        stored = self._approvals.get(approval.id)
        if stored is None or stored.state is not ApprovalState.PENDING:
            return False
        if decision.rule_id is not None:
            rule = self._rules.get(decision.rule_id)
            if rule is None or rule.revoked_at is not None:
                return False
        self._approvals[approval.id] = decision.applied(stored)
        self._write_audit(audit_entries.approval_decided(stored, decision))
        return True

    async def cancel_approvals(
        self, run_id: RunId, why: str, at: float, request_ids: tuple[str, ...] | None = None
    ) -> list[Approval]:
        """Cancel the run's pending requests (or those of ``request_ids``), one audit row each."""
        self._check_open()
        require_storable(why)
        cancel = ApprovalDecision(ApprovalState.CANCELLED, None, at, approval_reason(why))
        cancelled = []
        for approval in list(self._approvals.values()):
            if approval.run_id != run_id or approval.state is not ApprovalState.PENDING:
                continue
            if request_ids is not None and approval.request_id not in request_ids:
                continue
            done = cancel.applied(approval)
            self._approvals[approval.id] = done
            cancelled.append(done)
            self._write_audit(audit_entries.approval_decided(approval, cancel))
        return cancelled

    async def expired_approvals(self, now: float) -> list[Approval]:
        """Pending requests due to expire, oldest first (they stay pending)."""
        self._check_open()
        return [
            a
            for a in self._approvals.values()
            if a.state is ApprovalState.PENDING and a.expires_at <= now
        ]

    # Tool rules

    async def add_rule(self, new: NewRule) -> ToolRule:
        """Keep a rule for the room's channel, audited."""
        self._check_open()
        require_rule(new.scope, new.session_id, new.rule)
        require_storable(new.rule)
        kept = new.kept(len(self._rules) + 1)
        self._rules[kept.id] = kept
        self._write_audit(audit_entries.rule_added(kept))
        return kept

    async def active_rules(self, room: RoomKey, session_id: SessionId | None) -> list[ToolRule]:
        """The channel's unrevoked room rules and ``session_id``'s, oldest first."""
        self._check_open()
        return [
            r
            for r in self._rules.values()
            if r.room == room.channel
            and r.revoked_at is None
            and (
                r.scope is RuleScope.ROOM or (session_id is not None and r.session_id == session_id)
            )
        ]

    async def revoke_rule(
        self, room: RoomKey, rule_id: int, actor: UserId, at: float
    ) -> ToolRule | None:
        """End an unrevoked rule of the channel, audited; it, or None."""
        self._check_open()
        stored = self._rules.get(rule_id)
        if stored is None or stored.room != room.channel or stored.revoked_at is not None:
            return None
        revoked = replace(stored, revoked_by=actor, revoked_at=at)
        self._rules[rule_id] = revoked
        self._write_audit(audit_entries.rule_revoked(revoked))
        return revoked

    async def audit(self, entry: AuditEntry) -> None:
        """Append one audit row."""
        self._check_open()
        self._write_audit(entry)

    async def audit_trail(self, which: AuditFilter = WHOLE_TRAIL) -> list[AuditRecord]:
        """The audit rows ``which`` reads, in the order they were written."""
        self._check_open()
        return [a for a in self._audit if which.matches(a)]

    # Retention

    async def prune(self, older_than: float) -> int:
        """Delete old audit rows, old finished messages and runs left empty.

        The same rule as :meth:`bridge.store.sql.SqlStore.prune`.
        """
        self._check_open()
        before = len(self._audit)
        self._audit = [a for a in self._audit if a.at >= older_than]
        deleted = before - len(self._audit)

        gone = {
            i
            for i, s in self._messages.items()
            if s.message.received_at < older_than and s.state not in LIVE_STATES
        }
        for i in gone:
            stored = self._messages.pop(i)
            self._seen.discard((stored.message.room, stored.message.external_id))
        deleted += len(gone)

        # A finished entry's next_attempt_at is when it finished.
        done = [
            entry_id
            for entry_id, e in self._outbox.items()
            if e.state is not DeliveryState.PENDING and e.next_attempt_at < older_than
        ]
        for entry_id in done:
            del self._outbox[entry_id]
        deleted += len(done)

        finished = [
            approval_id
            for approval_id, a in self._approvals.items()
            if a.state is not ApprovalState.PENDING
            and a.decided_at is not None
            and a.decided_at < older_than
        ]
        for approval_id in finished:
            del self._approvals[approval_id]
        deleted += len(finished)

        stale = [k for k, (_, at) in self._seen_marks.items() if k.thread and at < older_than]
        for key in stale:
            del self._seen_marks[key]
        deleted += len(stale)

        old = [run_id for run_id, (_, at, _) in self._spend.items() if at < older_than]
        for run_id in old:
            del self._spend[run_id]
        deleted += len(old)

        for run_id, run in list(self._runs.items()):
            remaining = tuple(i for i in run.message_ids if i not in gone)
            if (
                not remaining
                and run.status is not RunStatus.RUNNING
                and run.ended_at is not None
                and run.ended_at < older_than
            ):
                del self._runs[run_id]
                self._live.pop(run_id, None)  # as ON DELETE CASCADE does
                deleted += 1
            elif remaining != run.message_ids:
                self._runs[run_id] = replace(run, message_ids=remaining)
        return deleted

    # Lifecycle

    async def ping(self) -> None:
        """Raise StoreError once the store is closed."""
        self._check_open()

    async def close(self) -> None:
        """Refuse further use, as a closed SQL store would."""
        self._closed = True

"""What the service records, and the one interface every store implements.

:class:`Store` combines role protocols (messages, runs, live runs, outbox,
rooms, transcripts, ledger, approvals, rules, audit, schedules, upkeep, and
the transports' :class:`~bridge.core.transport.SeenMarks`): the service holds
a ``Store``, each consumer takes only the roles it uses. Implementations:
``memory`` (unit tests, no durability) and ``sql`` (SQLAlchemy: SQLite or
PostgreSQL). One contract suite in ``tests/store`` runs against all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, replace
from enum import StrEnum
from typing import Protocol

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    LiveRun,
    Message,
    MessageId,
    Reply,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
    SessionId,
    UserId,
)
from bridge.core.transport import SeenMarks


class AuditAction(StrEnum):
    """One audit row per logical action (per message where a message is the subject)."""

    MESSAGE_ACCEPTED = "message_accepted"
    MESSAGE_IGNORED = "message_ignored"
    """Not authorized (or from a bot): recorded without its text."""
    MESSAGE_DISPATCHED = "message_dispatched"
    """A message went into a run: one row per message, carrying the run id."""
    MESSAGE_DROPPED = "message_dropped"
    """Dropped by ``!stop``: one row per message."""
    MESSAGE_EDITED = "message_edited"
    """A pending message's text was replaced by an edit (the new text is not audited)."""
    MESSAGE_DELETED = "message_deleted"
    """A pending message was deleted or redacted: it is dropped and never runs."""
    COMMAND = "command"
    RUN_STARTED = "run_started"
    RUN_FINISHED = "run_finished"
    STOP_REQUESTED = "stop_requested"
    RETRY_REQUESTED = "retry_requested"
    SESSION_RESET = "session_reset"
    SESSION_RESUMED = "session_resumed"
    """``!resume``: the room's next run continues an earlier session (detail: which)."""
    SESSION_FORKED = "session_forked"
    """``!fork``: the room's next run continues a copy of its session (detail: which)."""
    APPROVAL_ASKED = "approval_asked"
    """claude asked to use a tool; the room was asked (detail: number and tool)."""
    APPROVAL_ALLOWED = "approval_allowed"
    """Allowed by the actor, once or for the session (detail says which)."""
    APPROVAL_DENIED = "approval_denied"
    """Denied by the actor (detail: the reason)."""
    APPROVAL_EXPIRED = "approval_expired"
    """Nobody answered in time: denied, claude was told it timed out."""
    APPROVAL_CANCELLED = "approval_cancelled"
    """The run ended (or was stopped) while the request waited."""
    ROOM_OVERRIDE_SET = "room_override_set"
    """``!model`` or ``!mode`` changed what the room's runs use (detail: which, to what)."""
    RULE_ADDED = "rule_added"
    """A tool rule was kept (detail: its number, scope, effect and text)."""
    RULE_REVOKED = "rule_revoked"
    """``!rules revoke N`` ended a rule."""
    SCHEDULE_NOT_RUN = "schedule_not_run"
    """A schedule's firing was skipped (room busy) or missed (chatbridge was down);
    actor: the schedule; detail: the firing's time and why. A run firing is a message."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: RunId
    room: RoomKey
    status: RunStatus
    started_at: float
    ended_at: float | None
    pid: int | None
    message_ids: tuple[MessageId, ...]
    report: RunReport | None
    """None while the run is running."""
    replica: str | None = None
    """The replica that started it (docs/replicas.md); None for a single process."""


@dataclass(frozen=True, slots=True)
class RunEnding:
    """How a run ended and the replies that tell its room (:meth:`RunStore.finish_run`)."""

    run_id: RunId
    report: RunReport
    at: float
    replies: Sequence[Reply] = ()
    """Go into the outbox, pending, in order, with the end."""
    _: KW_ONLY
    keep_session: bool = False
    """The report's session (if any) becomes the room's with the end."""
    requeue: bool = False
    """The run never began: its messages become pending again instead of settled."""


STEERED = "steered"
"""The detail of the ``message_dispatched`` audit rows of messages steered into a running
run (``Store.steer_into_run``): one steer's rows share their time."""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """An audit row to write (:meth:`AuditStore.audit`): what happened, when, to what."""

    action: AuditAction
    at: float
    room: RoomKey | None = None
    actor: UserId | None = None
    message_id: MessageId | None = None
    run_id: RunId | None = None
    detail: str = ""

    @classmethod
    def asked(
        cls,
        message: Message,
        action: AuditAction,
        at: float,
        *,
        run_id: RunId | None = None,
        detail: str = "",
    ) -> AuditEntry:
        """The row of what ``message`` asked: in its room, by its sender, naming it."""
        return cls(action, at, message.room, message.sender, message.id, run_id, detail)

    def recorded(self, id: int) -> AuditRecord:
        """This entry as written under ``id``."""
        return AuditRecord(
            self.action,
            self.at,
            self.room,
            self.actor,
            self.message_id,
            self.run_id,
            self.detail,
            id=id,
        )


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which audit rows to read (:meth:`AuditStore.audit_trail`): those matching every
    field given (None: any)."""

    room: RoomKey | None = None
    """Exactly this conversation (a room's threads are conversations of their own)."""
    message_id: MessageId | None = None
    run_id: RunId | None = None

    def matches(self, entry: AuditEntry) -> bool:
        """Whether ``entry`` is one of the rows this filter reads."""
        wanted = (self.room, self.message_id, self.run_id)
        found = (entry.room, entry.message_id, entry.run_id)
        return all(w is None or w == f for w, f in zip(wanted, found, strict=True))


WHOLE_TRAIL = AuditFilter()
"""Reads every audit row."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRecord(AuditEntry):
    """An audit row as written: the entry and the id it was given (writing order)."""

    id: int


class DeliveryState(StrEnum):
    """Where an outbox entry stands."""

    PENDING = "pending"
    """Not yet (completely) delivered: the delivery worker owns it."""
    DELIVERED = "delivered"
    FAILED = "failed"
    """Given up: the chat server refused it for good (see the log)."""


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """A reply recorded for durable delivery (an answer, or a run's failure notice)."""

    id: int
    """Increases in recording order: a room's entries are delivered in this order."""
    reply: Reply
    key: str
    """Stable across attempts and restarts: the transports' idempotency key."""
    parts_done: int
    """Parts already delivered: a retry starts after them."""
    attempts: int
    next_attempt_at: float
    state: DeliveryState
    created: float
    run_id: RunId | None


@dataclass(frozen=True, slots=True)
class RegisteredRun:
    """A run in the registry of live runs: where its supervisor is, what the room saw."""

    live: LiveRun
    room: RoomKey
    delivered_offset: int
    """Journal offset up to which the room has been shown the run's output."""
    registered_at: float


class ApprovalState(StrEnum):
    """Where a tool-use request stands; only ``pending`` ever changes."""

    PENDING = "pending"
    ALLOWED = "allowed"
    ALLOWED_SESSION = "allowed_session"
    """Allowed, with claude's suggested rules for the rest of the session."""
    DENIED = "denied"
    EXPIRED = "expired"
    """Not answered before ``expires_at``: denied as timed out."""
    CANCELLED = "cancelled"
    """Its run ended while it waited: nobody can answer it any more."""


@dataclass(frozen=True, slots=True)
class ApprovalAsk:
    """A request of a run's claude to use a tool, to record (:meth:`ApprovalStore.add_approval`)."""

    room: RoomKey
    run_id: RunId
    request_id: str
    """The CLI's ``control_request`` id, which the answer must carry."""
    tool_name: str
    input_json: str
    """The tool's input as claude sent it (a JSON object)."""
    asked_at: float
    expires_at: float
    shown_digest: str = ""
    """sha256 of the request as the room was shown it
    (:attr:`bridge.live.tool_view.ToolView.digest`:
    the input and, for an edit, the file as it was); "" for requests recorded before it."""

    def pending(self, id: int, number: int) -> Approval:
        """This request as recorded under ``id`` and the room's ``number``, unanswered."""
        return Approval(
            self.room,
            self.run_id,
            self.request_id,
            self.tool_name,
            self.input_json,
            self.asked_at,
            self.expires_at,
            self.shown_digest,
            id=id,
            number=number,
            message_id=None,
            state=ApprovalState.PENDING,
            decided_by=None,
            decided_at=None,
            reason="",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval(ApprovalAsk):
    """A request of a run's claude to use a tool, asked in the run's room."""

    id: int
    """The store's id; increases in asking order."""
    number: int
    """Short per-room number people type (``!approve #3``): never reused in a room."""
    message_id: ExternalMessageId | None
    """The room message that asks (buttons, reactions), once it was posted."""
    state: ApprovalState
    decided_by: UserId | None
    """None while pending, and for decisions nobody made (expiry, cancellation)."""
    decided_at: float | None
    reason: str
    """Why it was denied or cancelled; empty otherwise."""


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """How a pending request ends (:meth:`ApprovalStore.decide_approval`)."""

    state: ApprovalState
    """Any end: allowed, allowed_session, denied, expired, or cancelled (claude withdrew it)."""
    decided_by: UserId | None
    """None for decisions nobody made (expiry, a kept rule, a withdrawal)."""
    decided_at: float
    reason: str = ""
    _: KW_ONLY
    rule_id: int | None = None
    """The kept rule deciding it, which must still hold (not revoked) as it does."""

    def applied(self, approval: Approval) -> Approval:
        """``approval`` as this decision leaves it."""
        by, at, reason = self.decided_by, self.decided_at, self.reason
        return replace(approval, state=self.state, decided_by=by, decided_at=at, reason=reason)


class RuleScope(StrEnum):
    """How long and where a tool rule holds (docs/live-runs.md)."""

    SESSION = "session"
    """The conversation's Claude session: every run resuming it; ``!reset`` ends it."""
    ROOM = "room"
    """Every conversation of the room, until revoked."""


class RuleEffect(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class NewRule:
    """A tool rule to keep (:meth:`RuleStore.add_rule`): who made it, when, saying what."""

    room: RoomKey
    """The room it was made in: the rule is kept for its channel."""
    scope: RuleScope
    effect: RuleEffect
    rule: str
    """In claude's rule syntax: ``Bash(npm test:*)`` (bridge/live/tool_rules.py)."""
    session_id: SessionId | None
    """The session a session rule holds in (it needs one); None for a room rule."""
    created_by: UserId
    at: float

    def kept(self, id: int) -> ToolRule:
        """The rule as kept under ``id``, for the room's channel."""
        scope, effect = self.scope, self.effect
        room, session_id, created_by = self.room.channel, self.session_id, self.created_by
        return ToolRule(id, room, scope, session_id, effect, self.rule, created_by, self.at)


@dataclass(frozen=True, slots=True)
class ToolRule:
    """A rule chatbridge keeps and applies itself to claude's tool requests."""

    id: int
    """The number ``!rules revoke N`` takes; never reused."""
    room: RoomKey
    """The room (its channel, for a thread conversation's rule)."""
    scope: RuleScope
    session_id: SessionId | None
    """The session a session rule holds in; None for a room rule."""
    effect: RuleEffect
    rule: str
    """In claude's rule syntax: ``Bash(npm test:*)`` (bridge/live/tool_rules.py)."""
    created_by: UserId
    created_at: float
    revoked_by: UserId | None = None
    revoked_at: float | None = None


@dataclass(frozen=True, slots=True)
class RoomOverrides:
    """What ``!model`` and ``!mode`` set for a room's next runs; None: the configured value."""

    model: str | None = None
    permission_mode: str | None = None
    fork: bool = False
    """``!fork``: the next run continues a copy of the session (``--fork-session``)."""


@dataclass(frozen=True, slots=True)
class LimitResume:
    """A run cut short by a usage limit, retried once when the limit resets."""

    run_id: RunId
    room: RoomKey
    resets_at: float


@dataclass(frozen=True, slots=True)
class Fence:
    """A replica's claim on a conversation (docs/replicas.md): its id and the lease's token.

    A write fenced with it fails (:class:`~bridge.store.cluster.Fenced`) unless the
    replica still holds the conversation's unexpired lease with this token.
    """

    replica: str
    token: int
    cluster_cap: int | None = None
    """``[cluster] max_concurrent_runs``: the start also waits for a free cluster slot."""


@dataclass(frozen=True, slots=True)
class TranscriptStamp:
    """Which version of a session's transcript is stored, told without its content."""

    size: int
    """The transcript file's length, uncompressed."""
    digest: str
    """SHA-256 of the transcript file (hex). claude only appends to a transcript: a copy
    whose first ``size`` bytes hash to this is this version, or a later one."""


@dataclass(frozen=True, slots=True)
class SessionTranscript:
    """A session's transcript to keep for its conversation
    (:meth:`TranscriptStore.save_transcript`)."""

    session_id: SessionId
    content: bytes
    """The session's files, compressed."""
    saved_at: float
    stamp: TranscriptStamp
    """Which version it is (:meth:`TranscriptStore.transcript_stamp` answers it)."""


class StoreError(Exception):
    """The store could not do what was asked (connection lost, schema missing...)."""


class MessageStore(Protocol):
    """Inbound messages: accepted, queued, edited, dropped (``bridge.inbound``)."""

    async def accept(self, msg: InboundMessage, received_at: float) -> Message | None:
        """Record ``msg`` as pending and audit it as accepted, in one transaction.

        Returns None, recording nothing, when a message with the same
        (transport, room, external id) was accepted before: redelivery.
        """
        ...

    async def record_ignored(self, msg: InboundMessage, reason: str, at: float) -> None:
        """Audit a message that was not accepted (unauthorized sender, bot)."""
        ...

    async def complete_command(self, message_id: MessageId) -> None:
        """Mark an accepted command message done: commands never go into a run."""
        ...

    async def pending_messages(self, room: RoomKey | None = None) -> list[Message]:
        """Every pending message of every conversation (or of ``room`` only, exactly
        that conversation), in acceptance order (recovery)."""
        ...

    async def pending_message(
        self, room: RoomKey, external_id: ExternalMessageId
    ) -> Message | None:
        """The message with this transport id in ``room`` (in any of its thread
        conversations), if it is still pending."""
        ...

    async def edit_pending(
        self, message_id: MessageId, text: str, actor: UserId | None, at: float
    ) -> Message | None:
        """Replace the text of a pending message, with one audit row, atomically.

        Returns the message as it now reads; None, changing nothing, if it
        is not pending any more or already reads ``text`` (a redelivered edit).
        """
        ...

    async def delete_pending(
        self, message_id: MessageId, actor: UserId | None, at: float
    ) -> Message | None:
        """Drop a pending message that was deleted, with one audit row, atomically.

        Returns the message; None, changing nothing, if it is not pending.
        """
        ...

    async def mark_dropped(self, ids: Sequence[MessageId], actor: UserId | None, at: float) -> None:
        """Mark messages dropped by ``!stop``, one audit row each."""
        ...

    async def messages(self, ids: Sequence[MessageId]) -> list[Message]: ...


class RunStore(Protocol):
    """Runs: started, steered into, finished, looked up, offered again (``!retry``)."""

    async def start_run(
        self, run_id: RunId, batch: Batch, at: float, fence: Fence | None = None
    ) -> None:
        """Record a running run and mark its messages dispatched into it, atomically.

        With a ``fence`` (replicas), only while that replica holds the batch's
        conversation with that token: otherwise nothing is recorded and
        :class:`~bridge.store.cluster.Fenced` raised."""
        ...

    async def steer_into_run(self, run_id: RunId, batch: Batch, at: float) -> None:
        """Add ``batch``'s messages to a running run (they were sent into its session):
        dispatched into it after its own messages, audited (detail ``steered``), atomically.
        A run that is not running raises :class:`StoreError`."""
        ...

    async def finish_run(self, ending: RunEnding) -> list[OutboxEntry]:
        """Record how a run ended and the replies that tell the room, in one transaction.

        Its messages become done (succeeded), dropped (stopped) or failed (or,
        with ``requeue``, for a run that never began: pending again), and
        its row in the registry of live runs goes (it is no longer live). The
        ``replies`` go into the outbox, pending, in order; the new entries are
        returned. With ``keep_session`` the report's session (if any) becomes
        the room's, in the same transaction, unless ``set_session`` was called
        for the room after this call (a ``!reset`` answered while the end
        waited for its commit is not undone). Only the first report counts:
        finishing a run that already ended records nothing and returns that
        run's entries still pending, in order: a caller retrying after a lost
        acknowledgement (the first try did commit) hands its answer over.
        A report with a cost (``cost_usd``) also writes the run's row of the
        budget ledger (see :meth:`spend`), in the same transaction.
        """
        ...

    async def get_run(self, run_id: RunId) -> RunRecord | None: ...

    async def running_runs(self) -> list[RunRecord]:
        """Runs still marked running: after a crash these are the ones to sweep."""
        ...

    async def last_run(self, room: RoomKey) -> RunRecord | None:
        """The room's most recently started run."""
        ...

    async def room_runs(self, room: RoomKey, limit: int) -> list[RunRecord]:
        """The conversation's ``limit`` most recently started runs, newest first
        (``!sessions``, ``!usage``)."""
        ...

    async def retryable_runs(self, room: RoomKey) -> list[RunRecord]:
        """The room's runs that ``!retry`` may run again, oldest first.

        A run is offered while its status is retryable and its messages are
        still failed with it as their last run (a retry, a ``!stop`` or a
        deletion ends that), until a later successful run of the room
        contains a message received after it ended: the conversation moved
        on. Messages re-queued from before the run ended never withdraw it.
        """
        ...

    async def requeue_run(self, run_id: RunId) -> list[Message]:
        """Mark pending again the messages that failed with ``run_id`` as their last run,
        if the run is offered by the rule of :meth:`retryable_runs` (whoever asks: ``!retry``,
        the retry after a usage limit).

        Returns them in order; empty if the run is not offered any more (a
        second ``!retry`` of the same run re-queues nothing, nor does a retry of a run
        the room moved past).
        """
        ...


class LiveRunStore(Protocol):
    """The registry of live runs: where each run's supervisor is, what its room saw."""

    async def register_live_run(self, live: LiveRun, at: float) -> None:
        """Record where the run's supervisor is reached, and claude's pid, durably.

        Inserts the run's registry row, or replaces the one it has (a reattach
        re-registers): the supervisor's whereabouts, claude's pid and
        ``registered_at`` become these; the delivered offset is kept (it is
        the room's progress, which a reattach must not show again). The
        run's pid becomes ``live.claude_pid``. One
        transaction, synced to disk before this returns: the bridge reports
        the run as started only after it. The room comes from the run's row.
        A run that is not running (unknown, or already finished) raises
        :class:`StoreError` and records nothing.
        """
        ...

    async def unregister_live_run(self, run_id: RunId) -> None:
        """Take a running run out of the registry of live runs and forget its pid, as if
        it had never been registered (its end is not recorded: the run stays running).

        For a try of the run whose claude is gone before the run began in earnest (it
        lost its session: bridge/runs/executor.py tries again with the same run id): a run left
        running that no replica registered, with no pid and no run directory, is one
        that never began (bridge/runs/stale_runs.py), whose messages its conversation's next
        owner runs. A run that is not running, or not registered, is left alone.
        """
        ...

    async def live_runs(self) -> list[RegisteredRun]:
        """Every registered run, oldest registration first (recovery reattaches them).

        Runs registered at the same time come in start order.
        """
        ...

    async def set_delivered_offset(self, run_id: RunId, offset: int) -> None:
        """Raise the run's delivered offset to ``offset`` (never lowers it).

        A run not in the registry is ignored. Not synced: losing the last few
        on a crash only repeats a little progress.
        """
        ...


class OutboxStore(Protocol):
    """Replies recorded for durable delivery, and how their delivery goes (``bridge.outbound``)."""

    async def enqueue(self, replies: Sequence[Reply], at: float) -> list[OutboxEntry]:
        """Put replies into the outbox, pending, in order (not tied to a run's end)."""
        ...

    async def enqueue_once(self, reply: Reply, key: str, at: float) -> list[OutboxEntry]:
        """Put ``reply`` into the outbox, pending, under ``key``, unless an entry (in any
        state) already has that key: then nothing is recorded and ``[]`` returned.

        For a post whose key is derived from what caused it (a file post from its
        tool use), so seeing the cause again (a reattached run replays its
        journal) never posts twice. ``key`` is at most 64 characters.
        """
        ...

    async def undelivered(self, room: RoomKey | None = None) -> list[OutboxEntry]:
        """Every pending outbox entry (or ``room``'s only, exactly that conversation),
        in recording order (recovery after a restart)."""
        ...

    async def delivery_progress(self, entry_id: int, parts_done: int) -> None:
        """Record that the first ``parts_done`` parts of an entry were delivered."""
        ...

    async def delivery_attempted(self, entry_id: int, next_attempt_at: float) -> None:
        """Count a failed attempt; the next one is due at ``next_attempt_at``."""
        ...

    async def delivery_finished(self, entry_id: int, state: DeliveryState, at: float) -> None:
        """Mark an entry delivered or failed (given up)."""
        ...


class RoomStore(Protocol):
    """A conversation's session and what ``!model``, ``!mode`` and ``!fork`` set for its runs."""

    async def get_session(self, room: RoomKey) -> SessionId | None: ...

    async def set_session(self, room: RoomKey, session_id: SessionId | None) -> None:
        """Remember the room's session; None forgets it, and its stored transcript with it."""
        ...

    async def room_overrides(self, room: RoomKey) -> RoomOverrides:
        """The room's model and permission mode set by command (none set: both None)."""
        ...

    async def room_state(self, room: RoomKey) -> tuple[SessionId | None, RoomOverrides]:
        """:meth:`get_session` and :meth:`room_overrides` in one read (a run's start needs both)."""
        ...

    async def set_room_model(self, room: RoomKey, model: str | None) -> None:
        """Set (None: clear) the model the room's next runs use; kept across ``!reset``."""
        ...

    async def set_room_fork(self, room: RoomKey, fork: bool) -> None:
        """Whether the room's next run forks its session (``!fork``; cleared as it does)."""
        ...

    async def set_room_mode(self, room: RoomKey, mode: str | None) -> None:
        """Set (None: clear) the permission mode the room's next runs use."""
        ...


class TranscriptStore(Protocol):
    """Session transcripts: a conversation's session on any replica (docs/replicas-sessions.md)."""

    async def save_transcript(self, room: RoomKey, transcript: SessionTranscript) -> None:
        """Keep ``transcript`` as the conversation's, in place of the one it kept (of any
        session)."""
        ...

    async def transcript_stamp(
        self, room: RoomKey, session_id: SessionId
    ) -> TranscriptStamp | None:
        """The stored transcript's stamp; None if the conversation keeps none of
        ``session_id`` (none at all, or another session's). Reads no content."""
        ...

    async def load_transcript(self, room: RoomKey, session_id: SessionId) -> bytes | None:
        """The stored transcript's content; None if it is not ``session_id``'s."""
        ...

    async def drop_transcript(self, room: RoomKey) -> None:
        """Forget the conversation's stored transcript, if any."""
        ...


class LedgerStore(Protocol):
    """Budgets and usage limits: the spend ledger, retries waiting for a limit (docs/budgets.md)."""

    async def spend(self, since: float, room: RoomKey | None = None) -> float:
        """USD the runs that ended at or after ``since`` cost: in ``room``, or in all rooms.

        Read from the ledger :meth:`finish_run` writes, which ``!reset`` and
        the pruning of runs leave alone (``prune`` drops its rows by age).
        """
        ...

    async def add_limit_resume(self, run_id: RunId, room: RoomKey, resets_at: float) -> None:
        """Note that ``run_id`` is to be retried once at ``resets_at``; a second call for the
        same run changes nothing (the first reset time stands)."""
        ...

    async def limit_resumes(self) -> list[LimitResume]:
        """Every retry still waiting for its limit to reset, the earliest first."""
        ...

    async def drop_limit_resume(self, run_id: RunId) -> bool:
        """Forget the waiting retry of ``run_id``; whether there was one."""
        ...

    async def requeue_limit_resume(self, run_id: RunId) -> list[Message] | None:
        """Make the waiting retry of ``run_id``: in one transaction, forget it and re-queue
        the run's messages as :meth:`requeue_run` does (empty if the run is not offered any
        more). None if no retry was waiting (called off: :meth:`drop_limit_resume`, or made
        already): of a retry and its calling off, one wins, whatever the interleaving."""
        ...


class ApprovalStore(Protocol):
    """Tool-use requests asked in a room and their answers (docs/live-runs.md)."""

    async def add_approval(self, ask: ApprovalAsk) -> Approval:
        """Record a pending request under the room's next number, audited, atomically.

        Idempotent on (``ask.run_id``, ``ask.request_id``): a reattached run replays
        its unanswered requests, and the one already recorded (whatever its
        state) is returned unchanged. Numbers increase per room and are never
        reused, not even after pruning.
        """
        ...

    async def set_approval_message(self, approval: Approval, message_id: ExternalMessageId) -> None:
        """Remember the room message that asks (reactions and buttons find it by this)."""
        ...

    async def pending_approvals(self, room: RoomKey | None = None) -> list[Approval]:
        """Pending requests (of one room, or of all), oldest first."""
        ...

    async def approval_by_number(self, room: RoomKey, number: int) -> Approval | None: ...

    async def approval_by_message(
        self, room: RoomKey, message_id: ExternalMessageId
    ) -> Approval | None: ...

    async def decide_approval(self, approval: Approval, decision: ApprovalDecision) -> bool:
        """Decide a pending request (allowed, allowed_session, denied, expired), audited.

        Compare-and-set: only a request still pending changes, so of two
        approvers answering at once exactly one call returns True; the
        other changes nothing, audits nothing and returns False. A decision
        by a kept rule (``rule_id``) needs that rule still to hold, too.
        """
        ...

    async def cancel_approvals(
        self, run_id: RunId, why: str, at: float, request_ids: tuple[str, ...] | None = None
    ) -> list[Approval]:
        """Cancel the run's pending requests (it ended), or only those of ``request_ids``
        (claude withdrew them), audited; returns them as cancelled."""
        ...

    async def expired_approvals(self, now: float) -> list[Approval]:
        """Pending requests whose ``expires_at`` is not after ``now``, oldest first.

        They stay pending: the caller denies each with ``decide_approval``
        (state ``expired``) and tells its run.
        """
        ...


class RuleStore(Protocol):
    """Tool rules chatbridge keeps and applies itself (docs/live-runs.md)."""

    async def add_rule(self, new: NewRule) -> ToolRule:
        """Keep a rule for its room's channel, audited (``rule_added``), atomically.

        A session rule needs its ``session_id``; a room rule takes none.
        """
        ...

    async def active_rules(self, room: RoomKey, session_id: SessionId | None) -> list[ToolRule]:
        """The unrevoked rules of ``room``'s channel that hold now: its room rules, and
        the session rules of ``session_id`` (none if None); oldest first."""
        ...

    async def revoke_rule(
        self, room: RoomKey, rule_id: int, actor: UserId, at: float
    ) -> ToolRule | None:
        """End rule ``rule_id`` of ``room``'s channel, audited (``rule_revoked``); it as
        revoked, or None if the channel has no such unrevoked rule (compare-and-set)."""
        ...


class AuditStore(Protocol):
    """The audit trail: one row per logical action."""

    async def audit(self, entry: AuditEntry) -> None:
        """Append one audit row."""
        ...

    async def audit_trail(self, which: AuditFilter = WHOLE_TRAIL) -> list[AuditRecord]:
        """The audit rows ``which`` reads (all by default), oldest first."""
        ...


class ScheduleStore(Protocol):
    """Which firing of each schedule was dealt with (docs/automation.md)."""

    async def schedule_marks(self) -> dict[str, float]:
        """Each schedule's latest firing time dealt with (fired, skipped or missed), by name."""
        ...

    async def mark_schedule(self, name: str, fired_at: float) -> None:
        """Record that ``name``'s firing at ``fired_at`` was dealt with; an earlier
        time than the one recorded changes nothing (marks never go back)."""
        ...


class Upkeep(Protocol):
    """The store itself: pruning, reachability, closing (the service's lifecycle)."""

    async def prune(self, older_than: float) -> int:
        """Delete audit rows, finished messages and finished runs older than ``older_than``.

        Also ledger rows of runs that ended before then, threads' seen marks
        not moved since then (rooms' own stay), outbox entries
        delivered or given up before then, and
        approvals decided before then (pending ones are kept). Never touches
        pending or dispatched messages, running runs or pending deliveries
        (registered runs are running; a registry row would go with its run).
        Returns how many rows were deleted.
        """
        ...

    async def ping(self) -> None:
        """Raise :class:`StoreError` if the store cannot be reached."""
        ...

    async def close(self) -> None: ...


class RunLifecycleStore(
    MessageStore,
    RunStore,
    LiveRunStore,
    OutboxStore,
    RoomStore,
    TranscriptStore,
    LedgerStore,
    AuditStore,
    Protocol,
):
    """What a run's start, steering and ending record (``bridge.runs``): its messages,
    its row and registry entry, its replies, its room's session, transcript and spend."""


class Store(
    RunLifecycleStore,
    ApprovalStore,
    RuleStore,
    ScheduleStore,
    Upkeep,
    SeenMarks,
    Protocol,
):
    """Durable state of the bridge: every role in one. Every method is atomic.

    The service holds a ``Store``; each consumer takes only the roles it uses.
    """

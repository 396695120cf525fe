"""The SQL schema as typed ORM models.

Times are float seconds since the epoch, enum-like columns short strings, surrogate keys
never reused; the migrations create exactly this schema (a test compares the two)
(docs/operations.md, "How the store writes").
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Explicit constraint names: migrations can then refer to them, and both
# backends get the same names.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID_LENGTH = 255
"""Room, user, message and session ids of every transport fit in this."""


class Base(DeclarativeBase):
    """Declarative base carrying the shared metadata."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RunRow(Base):
    """One ``claude -p`` run. Its id is also the marker of its processes."""

    __tablename__ = "runs"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    """Start order: "the room's last run" is the one with the highest ``seq``."""
    id: Mapped[str] = mapped_column(String(64), unique=True)
    transport: Mapped[str] = mapped_column(String(32))
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    status: Mapped[str] = mapped_column(String(16), index=True)
    started_at: Mapped[float] = mapped_column(Double)
    ended_at: Mapped[float | None] = mapped_column(Double)
    pid: Mapped[int | None] = mapped_column(Integer)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    session_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    cost_usd: Mapped[float | None] = mapped_column(Double)
    num_turns: Mapped[int | None] = mapped_column(Integer)
    duration_ms: Mapped[int | None] = mapped_column(Integer)
    session_not_found: Mapped[bool] = mapped_column(Boolean, default=False)
    result_excerpt: Mapped[str] = mapped_column(Text, default="")
    error_excerpt: Mapped[str] = mapped_column(Text, default="")
    replica: Mapped[str | None] = mapped_column(String(64))
    """The replica that started it (docs/replicas.md); None on a single process."""

    __table_args__ = (
        Index("ix_runs_room", "transport", "room_id", "seq"),
        {"sqlite_autoincrement": True},
    )


class MessageRow(Base):
    """An accepted message. Redelivery is rejected by the unique constraint."""

    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    transport: Mapped[str] = mapped_column(String(32))
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    external_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    sender: Mapped[str] = mapped_column(String(ID_LENGTH))
    text: Mapped[str] = mapped_column(Text)
    thread: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    received_at: Mapped[float] = mapped_column(Double, index=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    attachments: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    """The files shared with the message (name, mime, size, ref); None: none."""
    sender_name: Mapped[str | None] = mapped_column(Text)
    reply_to_text: Mapped[str | None] = mapped_column(Text)
    run_id: Mapped[str | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"), index=True
    )
    """The run the message last went into (``run_messages`` keeps every one)."""

    __table_args__ = (
        UniqueConstraint(
            "transport", "room_id", "external_id", name="uq_messages_transport_room_external"
        ),
        {"sqlite_autoincrement": True},
    )


class RunMessageRow(Base):
    """Which messages went into which run, in batch order.

    A retried message belongs to several runs; ``messages.run_id`` only names
    the last, so each run's own list lives here.
    """

    __tablename__ = "run_messages"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    message_id: Mapped[int] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    position: Mapped[int] = mapped_column(Integer)


class RoomRow(Base):
    """Per-room state that outlives a process: the Claude session to resume,
    the model and mode set by command, the last approval number handed out."""

    __tablename__ = "rooms"

    transport: Mapped[str] = mapped_column(String(32), primary_key=True)
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    session_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    model: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    permission_mode: Mapped[str | None] = mapped_column(String(32))
    last_approval: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    fork_next: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """``!fork``: the next run continues a copy of the session."""
    """Kept here, not derived from ``approvals``: pruning must not make numbers repeat."""


class AuditRow(Base):
    """One logical action. No foreign keys: audit rows outlive pruned messages."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Double, index=True)
    action: Mapped[str] = mapped_column(String(32))
    transport: Mapped[str | None] = mapped_column(String(32))
    room_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    actor: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    message_id: Mapped[int | None] = mapped_column(Integer, index=True)
    run_id: Mapped[str | None] = mapped_column(String(64), index=True)
    detail: Mapped[str] = mapped_column(Text, default="")

    __table_args__ = (
        Index("ix_audit_room", "transport", "room_id"),
        {"sqlite_autoincrement": True},
    )


class OutboxRow(Base):
    """A reply to deliver: recorded with the run's outcome, delivered with retries.

    No foreign keys, like the audit: an entry outlives its run's pruning
    until it is delivered.
    """

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    """Recording order: a room's entries are delivered in this order."""
    transport: Mapped[str] = mapped_column(String(32))
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    run_id: Mapped[str | None] = mapped_column(String(64))
    text: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(16))
    in_reply_to: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    thread: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    anchor: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    file: Mapped[str | None] = mapped_column(Text)
    """A file post: the path of the bridge's copy (``Reply.file``)."""
    key: Mapped[str] = mapped_column(String(64), unique=True)
    parts_done: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Double)
    """When the next attempt is due; once delivered or failed, when that happened."""
    state: Mapped[str] = mapped_column(String(16), index=True)
    created: Mapped[float] = mapped_column(Double)

    __table_args__ = ({"sqlite_autoincrement": True},)


class LiveRunRow(Base):
    """The registry of live runs: where a running run's detached supervisor is reached.

    Written when the supervisor is started or reattached, deleted with the
    run's outcome; a restarted bridge reattaches to every row
    (docs/detached-runs.md). The room is copied from the run, as the outbox
    keeps it, so recovery reads one table.
    """

    __tablename__ = "live_runs"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    transport: Mapped[str] = mapped_column(String(32))
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    supervisor_pid: Mapped[int] = mapped_column(Integer)
    supervisor_start: Mapped[int] = mapped_column(BigInteger)
    """Clock ticks after boot: beyond 32 bits after a long uptime at a high tick rate."""
    claude_pid: Mapped[int] = mapped_column(Integer)
    run_dir: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(Text)
    delivered_offset: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    """Journal byte offset the room has been shown up to; a journal may pass 2 GiB."""
    registered_at: Mapped[float] = mapped_column(Double)


class ApprovalRow(Base):
    """A tool-use request asked in a room (docs/live-runs.md).

    No foreign key to the run, like the audit: the record of who allowed
    what outlives the run's pruning until it is pruned itself.
    """

    __tablename__ = "approvals"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    transport: Mapped[str] = mapped_column(String(32))
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    number: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[str] = mapped_column(String(64))
    request_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    tool_name: Mapped[str] = mapped_column(Text)
    input_json: Mapped[str] = mapped_column(Text)
    asked_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)
    message_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    state: Mapped[str] = mapped_column(String(16))
    decided_by: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    decided_at: Mapped[float | None] = mapped_column(Double)
    reason: Mapped[str] = mapped_column(Text, default="")
    shown_digest: Mapped[str] = mapped_column(String(64), default="", server_default="")
    """sha256 of the request as the room was shown it ("" before Alembic 0011)."""

    __table_args__ = (
        # A replayed request (reattach) finds its row; also a run's requests.
        UniqueConstraint("run_id", "request_id", name="uq_approvals_run_request"),
        UniqueConstraint("transport", "room_id", "number", name="uq_approvals_room_number"),
        # Pending ones by age (the expiry sweep, !status); few rows are pending.
        Index("ix_approvals_state_expires", "state", "expires_at"),
        # A reaction or button names the request's message.
        Index("ix_approvals_message", "transport", "room_id", "message_id"),
        {"sqlite_autoincrement": True},
    )


class ToolRuleRow(Base):
    """A tool rule chatbridge keeps and applies itself (docs/live-runs.md).

    Kept under the room's channel (a thread conversation's rules are its
    room's); a session rule names its Claude session. Revoked rules stay,
    with who revoked them and when.
    """

    __tablename__ = "tool_rules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    transport: Mapped[str] = mapped_column(String(32))
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    scope: Mapped[str] = mapped_column(String(16))
    session_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    effect: Mapped[str] = mapped_column(String(16))
    rule: Mapped[str] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(ID_LENGTH))
    created_at: Mapped[float] = mapped_column(Double)
    revoked_by: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    revoked_at: Mapped[float | None] = mapped_column(Double)

    __table_args__ = (
        # Every request of a run reads its room's rules.
        Index("ix_tool_rules_room", "transport", "room_id"),
        {"sqlite_autoincrement": True},
    )


class ScheduleMarkRow(Base):
    """The latest firing time each schedule has dealt with (bridge/automation/schedules.py).

    What a restart needs to know which firings it missed; a firing's message
    itself is made unique by its external id, as any message.
    """

    __tablename__ = "schedule_marks"

    name: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    fired_at: Mapped[float] = mapped_column(Double)
    """The scheduled time (epoch seconds) of the latest firing run, skipped or missed."""


class SeenMarkRow(Base):
    """The newest message a transport saw in a room or thread (bridge.core.transport.SeenMarks).

    Slack's catch-up after a restart reads each channel's and thread's history
    from here on. ``room_id`` is kept as conversation keys are (the thread
    after the room's id); ``last_id`` compares as text.
    """

    __tablename__ = "seen_marks"

    transport: Mapped[str] = mapped_column(String(32), primary_key=True)
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    last_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    seen_at: Mapped[float] = mapped_column(Double)
    """When the mark last moved: a thread's mark not moved since the retention is pruned."""


class SpendRow(Base):
    """The budget ledger: what one run cost, by room and time (docs/budgets.md).

    Its own table, not a column read off ``runs``: it has no foreign key, so
    a pruned run keeps its cost until the ledger row is pruned in its turn,
    and ``!reset`` (which only forgets a session) never touches it.
    """

    __tablename__ = "spend"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    transport: Mapped[str] = mapped_column(String(32))
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    at: Mapped[float] = mapped_column(Double)
    """When the run ended: its cost counts for that day."""
    cost_usd: Mapped[float] = mapped_column(Double)

    __table_args__ = (
        # "Spend today in room X" and "in all rooms": range scans by time.
        Index("ix_spend_room_at", "transport", "room_id", "at"),
        Index("ix_spend_at", "at"),
    )


class LimitResumeRow(Base):
    """A run cut short by a usage limit, to be retried once when the limit resets.

    Deleted when the retry is made; the retry itself re-queues the run's
    messages at most once (``requeue_run``), so a restart between the two
    cannot retry twice.
    """

    __tablename__ = "limit_resumes"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    transport: Mapped[str] = mapped_column(String(32))
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    resets_at: Mapped[float] = mapped_column(Double)


class ReplicaRow(Base):
    """A ``chatbridge run`` process serving with others (docs/replicas.md)."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    instance: Mapped[str] = mapped_column(String(36))
    """New at every start: tells a restarted replica from the one it replaces."""
    host: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Double)
    heartbeat_at: Mapped[float] = mapped_column(Double)
    """The database's clock at the last renewal."""
    runs: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    capacity: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    draining: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    state_dir: Mapped[str | None] = mapped_column(Text)
    """Its ``[runner] state_dir``: on its host, where its runs' directories are."""


class LeaseRow(Base):
    """Who owns a conversation (or, with an empty ``room_id``, leads a transport)."""

    __tablename__ = "leases"

    transport: Mapped[str] = mapped_column(String(32), primary_key=True)
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    token: Mapped[int] = mapped_column(BigInteger)
    """The fencing token: grows by one whenever the lease changes hands."""
    expires_at: Mapped[float] = mapped_column(Double)
    acquired_at: Mapped[float] = mapped_column(Double)


class SessionTranscriptRow(Base):
    """The latest Claude session transcript of a conversation, so another replica can
    ``--resume`` it (docs/replicas-sessions.md). One row per conversation: only the
    session the conversation resumes next matters; ``!reset`` deletes it."""

    __tablename__ = "session_transcripts"

    transport: Mapped[str] = mapped_column(String(32), primary_key=True)
    room_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    content: Mapped[bytes] = mapped_column(LargeBinary)
    """The session's files as claude keeps them, compressed (bridge/runs/transcripts.py)."""
    size: Mapped[int] = mapped_column(BigInteger)
    """The transcript file's length, uncompressed."""
    digest: Mapped[str] = mapped_column(String(64))
    """SHA-256 of the transcript file (hex): with ``size``, tells a replica whether its
    own copy is this version, a later one, or another (``TranscriptStamp``)."""
    saved_at: Mapped[float] = mapped_column(Double)

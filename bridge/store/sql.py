"""The durable store on SQLAlchemy: SQLite or PostgreSQL.

Every public method is one short transaction (a body run by :mod:`bridge.store.transactions`);
every SQLAlchemy or driver error leaves as :class:`StoreError`, cancellation propagates
untouched. Which commits are synced to disk and which share a transaction:
docs/operations.md, "How the store writes".
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    Table,
    bindparam,
    delete,
    exists,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy import insert as insert_statement
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Mapped, Session, aliased

from bridge.core.model import (
    Attachment,
    Batch,
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
    TransportName,
    UserId,
)
from bridge.store.base import (
    STEERED,
    Approval,
    ApprovalState,
    AuditAction,
    AuditRecord,
    DeliveryState,
    Fence,
    LimitResume,
    OutboxEntry,
    RegisteredRun,
    RoomOverrides,
    RuleEffect,
    RuleScope,
    RunRecord,
    StoreError,
    ToolRule,
    TranscriptStamp,
)
from bridge.store.batching import Committing, Failed, GroupCommit
from bridge.store.cluster import check_fence
from bridge.store.engine import (
    DEFAULT_URL,
    create_engine,
    is_sqlite_file,
    redacted,
)
from bridge.store.keys import THREAD_SEPARATOR
from bridge.store.keys import room_key as _room
from bridge.store.keys import stored_id as _stored_id
from bridge.store.migrate import (
    connect_failure,
    head_revision,
    migrate,
    newer_schema,
    revision_of,
)
from bridge.store.rules import (
    APPROVAL_ACTIONS,
    LIVE_STATES,
    approval_detail,
    approval_reason,
    delivery_key,
    excerpt,
    finished_message_state,
    ignored_detail,
    require_decision,
    require_rule,
    rule_detail,
)
from bridge.store.tables import (
    ApprovalRow,
    AuditRow,
    Base,
    LimitResumeRow,
    LiveRunRow,
    MessageRow,
    OutboxRow,
    RoomRow,
    RunMessageRow,
    RunRow,
    ScheduleMarkRow,
    SeenMarkRow,
    SessionTranscriptRow,
    SpendRow,
    ToolRuleRow,
)
from bridge.store.transactions import Body, InThreads, OnDriver, Transactions

_LIVE = tuple(str(s) for s in LIVE_STATES)

# Core tables for executemany: plain rows, no ORM unit of work per message.
_MESSAGES: Table = MessageRow.__table__  # type: ignore[assignment]
_AUDIT: Table = AuditRow.__table__  # type: ignore[assignment]
_RUNS: Table = RunRow.__table__  # type: ignore[assignment]
_RUN_MESSAGES: Table = RunMessageRow.__table__  # type: ignore[assignment]
_OUTBOX: Table = OutboxRow.__table__  # type: ignore[assignment]
_LIVE_RUNS: Table = LiveRunRow.__table__  # type: ignore[assignment]
_SPEND: Table = SpendRow.__table__  # type: ignore[assignment]

_MAX_NUMBER = 2**31 - 1
"""The largest approval number an ``Integer`` column holds on every backend."""

ACCEPT_GROUP_LIMIT = 256
"""Messages per group-commit transaction of :meth:`SqlStore.accept` at most."""

FINISH_GROUP_LIMIT = 64
"""Runs per group-commit transaction of :meth:`SqlStore.finish_run` at most."""

ENTRY_GROUP_LIMIT = 256
"""Outbox entries' delivery records per group-commit transaction at most."""

_ItemT = TypeVar("_ItemT")
_ResultT = TypeVar("_ResultT")


@dataclass(frozen=True, slots=True)
class _Finish:
    """One :meth:`SqlStore.finish_run` call, queued for a shared transaction."""

    run_id: RunId
    report: RunReport
    at: float
    replies: tuple[Reply, ...]
    keep_session: bool
    sessions_set: int
    """:attr:`SqlStore._sessions_set` when the call was made: a later ``set_session`` wins."""
    requeue: bool = False


@dataclass(frozen=True, slots=True)
class _EntryUpdate:
    """One delivery record of an outbox entry, queued for a shared transaction."""

    entry_id: int
    values: dict[str, Any]


class SqlStore:
    """:class:`~bridge.store.base.Store` on SQLite (default) or PostgreSQL.

    Create it with :meth:`open`; :meth:`close` releases its connections.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        """Wrap an engine from :func:`bridge.store.engine.create_engine`; prefer :meth:`open`.

        A SQLite file is written and read in threads of the store's own
        (:class:`~bridge.store.transactions.InThreads`), on connections of its
        own; any other database through ``engine``. The store disposes both.
        """
        self._engine = engine
        self._tx: Transactions = (
            InThreads(engine.url.render_as_string(hide_password=False))
            if is_sqlite_file(engine.url)
            else OnDriver(engine)
        )
        self._closed = False
        # Session keeping: a set_session (a !reset) made while a run's end
        # waits for its group commit must not be undone by that commit.
        self._sessions_set = 0
        """``set_session`` calls so far."""
        self._session_set_at: dict[RoomKey, int] = {}
        """Per room, the number of its latest ``set_session`` call."""
        self._session_writes = asyncio.Lock()
        """Held from deciding which sessions a group keeps until its commit, and by
        ``set_session``: the two never interleave."""
        self._accepts: GroupCommit[tuple[InboundMessage, float], Message | None] = GroupCommit(
            self._accept_group, limit=ACCEPT_GROUP_LIMIT
        )
        self._finishes: GroupCommit[_Finish, list[OutboxEntry]] = GroupCommit(
            self._finish_group, limit=FINISH_GROUP_LIMIT
        )
        # Each delivered answer writes two records (its part, its end), synced:
        # with many answers going out at once they would queue one by one in
        # front of the next runs' ends.
        self._entry_updates: GroupCommit[_EntryUpdate, None] = GroupCommit(
            self._update_entries, limit=ENTRY_GROUP_LIMIT
        )

    @property
    def engine(self) -> AsyncEngine:
        """The writer engine, for what shares the database (replicas' leases)."""
        return self._engine

    @property
    def _server_may_restart(self) -> bool:
        """Whether the database can lose a commit not synced to disk while this process
        lives on (a PostgreSQL server's crash or restart): see :meth:`start_run`."""
        return self._engine.dialect.name != "sqlite"

    @property
    def writes_on(self) -> Engine:
        """The engine whose events see every write transaction of this store.

        For tests and benchmarks that watch the commits. On a SQLite file its
        events fire in the store's writer thread.
        """
        return self._tx.engine

    @classmethod
    async def open(
        cls,
        url: str = DEFAULT_URL,
        *,
        auto_migrate: bool = True,
        idle_transaction_timeout_s: float | None = None,
    ) -> SqlStore:
        """Connect to ``url``, migrating its schema to head first if ``auto_migrate``.

        Without ``auto_migrate`` a database whose schema is not at head is an
        error: the operator runs ``chatbridge migrate`` deliberately.
        """
        if auto_migrate:
            await migrate(url)
        engine = create_engine(url, idle_transaction_timeout_s=idle_transaction_timeout_s)
        started = time.monotonic()
        try:
            async with engine.connect() as conn:
                _require_head(url, await revision_of(conn))
        except (SQLAlchemyError, OSError) as exc:
            await engine.dispose()
            why = connect_failure(exc, started)
            raise StoreError(f"cannot open the store at {redacted(url)}: {why}") from exc
        except BaseException:
            await engine.dispose()
            raise
        if is_sqlite_file(url):
            # The store reads and writes the file through connections of its own
            # (InThreads): this one, and its aiosqlite thread, would only idle.
            await engine.dispose()
        return cls(engine)

    async def _write(
        self,
        body: Body[_ResultT],
        *,
        synced: bool = True,
        committing: Callable[[], None] | None = None,
    ) -> _ResultT:
        """``body`` in one write transaction, committed (with a disk sync unless
        ``synced`` is false); errors become StoreError. See
        :mod:`bridge.store.transactions`, also for ``committing``."""
        if self._closed:
            # Disposing alone would let the pool quietly reconnect.
            raise StoreError("the store is closed")
        return await self._tx.write(body, synced=synced, committing=committing)

    async def _read(self, body: Body[_ResultT]) -> _ResultT:
        """``body`` in a read-only transaction on a reader connection: takes no write lock.

        It sees what was committed when it began; every write of this store
        has committed before its method returned, so a caller reads its own
        writes.
        """
        if self._closed:
            raise StoreError("the store is closed")
        return await self._tx.read(body)

    # Messages

    async def accept(self, msg: InboundMessage, received_at: float) -> Message | None:
        """Record ``msg`` as pending and audit it, or return None on redelivery.

        Concurrent calls share one transaction (group commit, see
        :mod:`bridge.store.batching`): each still returns only once its
        message is committed. A lost connection or a lock timeout fails
        every call in that transaction; a message the database refuses fails
        only its own call. A call cancelled once its transaction is under way
        may still have its message committed.
        """
        if self._closed:
            raise StoreError("the store is closed")
        return await self._accepts.submit((msg, received_at))

    async def _accept_group(
        self, group: Sequence[tuple[InboundMessage, float]], committing: Committing
    ) -> list[Message | Failed | None]:
        """Insert the messages not yet stored, in order, in one transaction."""
        return await _isolating(group, self._accept_together, committing)

    async def _accept_together(
        self, group: Sequence[tuple[InboundMessage, float]], committing: Committing
    ) -> list[Message | None]:
        """Insert the messages not yet stored, in order, in one transaction.

        One INSERT for the messages and one for their audit rows, whatever
        the group's size: per-statement overhead, not the commit, would
        otherwise bound a group.
        """
        # A key twice in one group: the first is the message, later ones are
        # redeliveries, exactly as if they had come one after the other.
        first: dict[tuple[str, str, str], int] = {}
        for position, (msg, _) in enumerate(group):
            first.setdefault(_key(msg), position)
        fresh = sorted(first.values())

        def body(s: Session) -> list[int | None]:
            # ON CONFLICT DO NOTHING rather than catching IntegrityError: a
            # message already stored (or being stored by another process,
            # whose commit this waits for) inserts nothing, and no other
            # integrity error is mistaken for redelivery. The statement is the
            # same whatever the group's size, so it is compiled once; with
            # RETURNING, SQLAlchemy sends the rows as one multi-row INSERT
            # ("insertmanyvalues"), whose rows get their ids in order.
            insert = self._insert(_MESSAGES).on_conflict_do_nothing(
                index_elements=["transport", "room_id", "external_id"]
            )
            insert = insert.returning(
                _MESSAGES.c.id, _MESSAGES.c.transport, _MESSAGES.c.room_id, _MESSAGES.c.external_id
            )
            rows = s.execute(insert, [_message_values(*group[p]) for p in fresh])
            # RETURNING order is unspecified: match rows by their key.
            new_ids: dict[tuple[str, str, str], int] = {(t, r, e): i for i, t, r, e in rows}
            ids = [
                new_ids.get(_key(msg)) if first[_key(msg)] == position else None
                for position, (msg, _) in enumerate(group)
            ]
            audit = [
                _accepted_audit_values(msg, received_at, new_id)
                for new_id, (msg, received_at) in zip(ids, group, strict=True)
                if new_id is not None
            ]
            if audit:
                s.execute(insert_statement(_AUDIT), audit)
            return ids

        ids = await self._write(body, committing=committing)
        return [
            None if new_id is None else msg.accepted(MessageId(new_id), received_at)
            for new_id, (msg, received_at) in zip(ids, group, strict=True)
        ]

    def _larger(self, a: Any, b: Any) -> Any:
        """The larger of two values, in SQL."""
        # SQLite's two-argument max() is PostgreSQL's greatest().
        larger = func.max if self._engine.dialect.name == "sqlite" else func.greatest
        return larger(a, b)

    def _insert(self, table: type[Base] | Table) -> Any:
        # Both dialects spell ON CONFLICT the same way, through different classes.
        # Imported here: a SQLite deployment never loads the PostgreSQL dialect.
        if self._engine.dialect.name == "postgresql":
            from sqlalchemy.dialects import postgresql

            return postgresql.insert(table)
        from sqlalchemy.dialects import sqlite

        return sqlite.insert(table)

    async def record_ignored(self, msg: InboundMessage, reason: str, at: float) -> None:
        """Audit a message that was not accepted, without its text."""

        def body(s: Session) -> None:
            s.add(
                _audit_row(
                    AuditAction.MESSAGE_IGNORED,
                    at,
                    room=msg.room,
                    actor=msg.sender,
                    detail=ignored_detail(reason, msg.external_id),
                )
            )

        await self._write(body)

    async def complete_command(self, message_id: MessageId) -> None:
        """Mark a pending command message done: commands never go into a run."""

        def body(s: Session) -> None:
            s.execute(
                update(MessageRow)
                .where(
                    MessageRow.id == message_id,
                    MessageRow.state == MessageState.PENDING.value,
                )
                .values(state=MessageState.DONE.value)
            )

        await self._write(body)

    async def pending_messages(self, room: RoomKey | None = None) -> list[Message]:
        """Every pending message (or ``room``'s), in acceptance order."""
        query = select(MessageRow).where(MessageRow.state == MessageState.PENDING.value)
        if room is not None:
            query = query.where(
                MessageRow.transport == room.transport, MessageRow.room_id == _stored_id(room)
            )

        def body(s: Session) -> list[Message]:
            rows = s.scalars(query.order_by(MessageRow.id))
            return [_message(r) for r in rows]

        return await self._read(body)

    async def mark_dropped(self, ids: Sequence[MessageId], actor: UserId | None, at: float) -> None:
        """Drop the pending or dispatched ones of these messages, one audit row each.

        Messages that already finished (done, failed, dropped) keep their state
        and get no audit row: ``!stop`` cannot undo what already happened.
        """

        def body(s: Session) -> None:
            rows = (
                s.scalars(
                    select(MessageRow)
                    .where(MessageRow.id.in_(ids), MessageRow.state.in_(_LIVE))
                    .order_by(MessageRow.id)
                )
            ).all()
            for row in rows:
                row.state = MessageState.DROPPED.value
                s.add(
                    _audit_row(
                        AuditAction.MESSAGE_DROPPED,
                        at,
                        room=_room(row.transport, row.room_id),
                        actor=actor,
                        message_id=row.id,
                        run_id=row.run_id,
                    )
                )

        await self._write(body)

    async def pending_message(
        self, room: RoomKey, external_id: ExternalMessageId
    ) -> Message | None:
        """The pending message with this transport id in ``room``, or None."""

        def body(s: Session) -> Message | None:
            row = s.scalar(
                select(MessageRow).where(
                    MessageRow.transport == room.transport,
                    _in_room(MessageRow.room_id, room),
                    MessageRow.external_id == external_id,
                    MessageRow.state == MessageState.PENDING.value,
                )
            )
            return None if row is None else _message(row)

        return await self._read(body)

    async def edit_pending(
        self, message_id: MessageId, text: str, actor: UserId | None, at: float
    ) -> Message | None:
        """Replace a pending message's text and audit it; None if not pending or unchanged.

        The UPDATE's condition decides, so an edit racing the message's
        dispatch either lands before it or changes nothing.
        """
        return await self._change_pending(
            message_id,
            AuditAction.MESSAGE_EDITED,
            actor,
            at,
            {"text": text},
            MessageRow.text != text,
        )

    async def delete_pending(
        self, message_id: MessageId, actor: UserId | None, at: float
    ) -> Message | None:
        """Drop a pending message that was deleted and audit it; None if not pending."""
        return await self._change_pending(
            message_id,
            AuditAction.MESSAGE_DELETED,
            actor,
            at,
            {"state": MessageState.DROPPED.value},
        )

    async def _change_pending(
        self,
        message_id: MessageId,
        action: AuditAction,
        actor: UserId | None,
        at: float,
        values: dict[str, str],
        *conditions: ColumnElement[bool],
    ) -> Message | None:
        """Update a message only while it is pending and ``conditions`` hold; audit it."""

        def body(s: Session) -> Message | None:
            row = s.scalar(
                update(MessageRow)
                .where(
                    MessageRow.id == message_id,
                    MessageRow.state == MessageState.PENDING.value,
                    *conditions,
                )
                .values(**values)
                .returning(MessageRow)
            )
            if row is None:
                return None
            message = _message(row)
            s.add(_audit_row(action, at, room=message.room, actor=actor, message_id=row.id))
            return message

        return await self._write(body)

    async def messages(self, ids: Sequence[MessageId]) -> list[Message]:
        """The messages with these ids that exist, in acceptance order."""

        def body(s: Session) -> list[Message]:
            rows = s.scalars(
                select(MessageRow).where(MessageRow.id.in_(ids)).order_by(MessageRow.id)
            )
            return [_message(r) for r in rows]

        return await self._read(body)

    async def message_states(self, ids: Sequence[MessageId]) -> dict[MessageId, MessageState]:
        """The state of each of these messages that exists.

        For operators and tests; not part of the :class:`Store` protocol.
        """

        def body(s: Session) -> dict[MessageId, MessageState]:
            rows = s.execute(select(MessageRow.id, MessageRow.state).where(MessageRow.id.in_(ids)))
            return {MessageId(i): MessageState(state) for i, state in rows}

        return await self._read(body)

    # Runs

    async def start_run(
        self, run_id: RunId, batch: Batch, at: float, fence: Fence | None = None
    ) -> None:
        """Record a running run, dispatch its messages into it, audit both.

        Writes one ``message_dispatched`` row per message and one
        ``run_started`` row, in the same transaction.

        On SQLite committed without a disk sync: claude's spawn waits for
        this commit (recovery must find every run that may have started), not
        for the disk. Why that is safe there:

        - A crash of chatbridge loses nothing: the commit is in SQLite's WAL
          file, in the OS's cache.
        - A crash of the OS can lose the most recent unsynced commits, and
          only as a whole, newest first: the log is replayed in order up to
          the first commit missing. The messages are then ``pending`` again,
          the run row and its ``message_dispatched`` rows gone: recovery
          re-queues pending messages and they run again (the process died
          with the OS).
        - The next synced commit on the writer writes the log up to and
          including this one: :meth:`register_live_run`, right after the spawn,
          which is why that one syncs. So a re-run after an OS crash is
          only possible for a run whose claude had started milliseconds
          before, too early to have acted; any run that may have acted is
          found by recovery, reported interrupted and offered to ``!retry``,
          never run again unasked.

        On PostgreSQL synced: the server can crash or restart on its own while
        chatbridge lives on, and an unsynced commit still in its WAL buffers
        is lost then; the run's claude would go on, its end would find no run,
        and its messages would run a second time (seen in the replicas' test
        of a PostgreSQL restarted under load). The sync there measured no
        slower (``bench/bench_store.py``, "all synced").
        """
        ids = list(batch.ids)
        room = batch.room

        # Core statements, four whatever the batch's size: on every run's path
        # the ORM's unit of work cost more than the statements themselves
        # (about 7 ms against 4 ms per start on SQLite, 2026-11-23).
        def body(s: Session) -> None:
            if fence is not None:
                # First, before any write: the lease row's share lock orders
                # this start against a takeover (bridge/store/cluster.py).
                check_fence(s, room, fence)
            s.execute(
                insert_statement(_RUNS).values(
                    id=run_id,
                    replica=None if fence is None else fence.replica,
                    transport=room.transport,
                    room_id=_stored_id(room),
                    status=RunStatus.RUNNING.value,
                    started_at=at,
                    session_not_found=False,
                    result_excerpt="",
                    error_excerpt="",
                )
            )
            audit = _dispatch_into(s, run_id, batch, at, first=0)
            started = AuditAction.RUN_STARTED
            detail = f"{len(ids)} message(s)"
            audit.append(_audit_values(started, at, room, run_id=run_id, detail=detail))
            s.execute(insert_statement(_AUDIT), audit)

        await self._write(body, synced=self._server_may_restart)

    async def steer_into_run(self, run_id: RunId, batch: Batch, at: float) -> None:
        """Add messages sent into a running run's session to that run (see the protocol).

        Synced as :meth:`start_run` is (on SQLite not, on PostgreSQL yes)."""

        def body(s: Session) -> None:
            running = s.execute(
                update(_RUNS)
                .where(_RUNS.c.id == run_id, _RUNS.c.status == RunStatus.RUNNING.value)
                .values(status=RunStatus.RUNNING.value)
            )
            if _rowcount(running) != 1:
                raise StoreError(f"run {run_id} is not running")
            last = s.scalar(
                select(func.max(_RUN_MESSAGES.c.position)).where(_RUN_MESSAGES.c.run_id == run_id)
            )
            first = 0 if last is None else int(last) + 1
            audit = _dispatch_into(s, run_id, batch, at, first=first, detail=STEERED)
            s.execute(insert_statement(_AUDIT), audit)

        await self._write(body, synced=self._server_may_restart)

    async def register_live_run(self, live: LiveRun, at: float) -> None:
        """Record (or replace) where the run's supervisor is reached, and claude's pid.

        Committed with a disk sync, which makes the run's start (committed
        without one on SQLite, see :meth:`start_run`) durable as well: from here on an
        OS crash leaves a run that recovery reports, never one that silently
        runs again. The bridge makes this write beside the running process,
        so the sync is not on the answer's path, and reports the run as
        started only after it.

        The run's row is updated first, on the condition that it is running:
        that row lock orders this against a concurrent :meth:`finish_run` on
        PostgreSQL too (whichever comes second sees the other's commit), so
        no registry row outlives its run's end.
        """

        def body(s: Session) -> None:
            run = (
                s.execute(
                    update(_RUNS)
                    .where(_RUNS.c.id == live.run_id, _RUNS.c.status == RunStatus.RUNNING.value)
                    .values(pid=live.claude_pid)
                    .returning(_RUNS.c.transport, _RUNS.c.room_id)
                )
            ).one_or_none()
            if run is None:
                raise StoreError(f"no running run {live.run_id}")
            whereabouts = {
                "transport": run.transport,
                "room_id": run.room_id,
                "supervisor_pid": live.supervisor_pid,
                "supervisor_start": live.supervisor_start,
                "claude_pid": live.claude_pid,
                "run_dir": live.run_dir,
                "host": live.host,
                "registered_at": at,
            }
            upsert = self._insert(_LIVE_RUNS).values(run_id=live.run_id, **whereabouts)
            # delivered_offset is left out: a reattach keeps what the room saw.
            s.execute(
                upsert.on_conflict_do_update(
                    index_elements=["run_id"],
                    set_={name: upsert.excluded[name] for name in whereabouts},
                )
            )

        await self._write(body)

    async def unregister_live_run(self, run_id: RunId) -> None:
        """Take a running run out of the registry and forget its pid (synced, like the
        registration it undoes). The run's row first, on the condition that it is
        running: ordered against :meth:`finish_run` as :meth:`register_live_run` is."""

        def body(s: Session) -> None:
            running = (
                s.execute(
                    update(_RUNS)
                    .where(_RUNS.c.id == run_id, _RUNS.c.status == RunStatus.RUNNING.value)
                    .values(pid=None)
                    .returning(_RUNS.c.id)
                )
            ).one_or_none()
            if running is not None:
                s.execute(delete(_LIVE_RUNS).where(_LIVE_RUNS.c.run_id == run_id))

        await self._write(body)

    async def live_runs(self) -> list[RegisteredRun]:
        """Every registered run, oldest registration first, then in start order."""

        def body(s: Session) -> list[RegisteredRun]:
            rows = s.scalars(
                select(LiveRunRow)
                .join(RunRow, RunRow.id == LiveRunRow.run_id)
                # Start order breaks ties, not the run id: PostgreSQL would
                # order text by its collation, the memory store by code point.
                .order_by(LiveRunRow.registered_at, RunRow.seq)
            )
            return [_registered_run(r) for r in rows]

        return await self._read(body)

    async def set_delivered_offset(self, run_id: RunId, offset: int) -> None:
        """Raise the run's delivered offset; a run not in the registry is ignored.

        Committed without a disk sync (see the module's docstring).
        """

        def body(s: Session) -> None:
            s.execute(
                update(_LIVE_RUNS)
                .where(_LIVE_RUNS.c.run_id == run_id)
                .values(delivered_offset=self._larger(_LIVE_RUNS.c.delivered_offset, offset))
            )

        await self._write(body, synced=False)

    async def finish_run(
        self,
        run_id: RunId,
        report: RunReport,
        at: float,
        replies: Sequence[Reply] = (),
        *,
        keep_session: bool = False,
        requeue: bool = False,
    ) -> list[OutboxEntry]:
        """Record how a run ended, settle its still-dispatched messages, enqueue ``replies``.

        Succeeded -> done, stopped -> dropped, anything else -> failed (see
        :func:`bridge.store.rules.finished_message_state`). The run's row in
        the registry of live runs is deleted. Only the first
        report counts: finishing a run that already ended changes nothing and
        returns that run's entries still pending (a retry after a lost
        acknowledgement of the commit).
        Writes one ``run_finished`` audit row; the outcome and the replies
        share the transaction, so an answer is never lost between them.

        With ``keep_session`` the report's session (if any) becomes the
        room's, unless :meth:`set_session` was called for the room after this
        call: a ``!reset`` answered while this end waited for its group
        commit is not undone by it.

        Concurrent calls share one transaction (group commit), each
        returning once its run's end is committed, with a disk sync. An
        unknown run fails only its own call; so does a reply the database
        refuses. A lost connection or a lock timeout fails every call in the
        transaction.
        """
        if self._closed:
            raise StoreError("the store is closed")
        finish = _Finish(
            run_id, report, at, tuple(replies), keep_session, self._sessions_set, requeue
        )
        return await self._finishes.submit(finish)

    async def _finish_group(
        self, group: Sequence[_Finish], committing: Committing
    ) -> list[list[OutboxEntry] | Failed]:
        """Record the ends of ``group``, in order, in one transaction."""
        if not any(f.keep_session and f.report.session_id is not None for f in group):
            return await _isolating(group, self._finish_together, committing)
        # Which sessions are kept is decided in the transaction (see
        # _finish_together); no set_session may commit between that and the
        # group's commit, or its value would be overwritten by an older one.
        async with self._session_writes:
            return await _isolating(group, self._finish_together, committing)

    async def _finish_together(
        self, group: Sequence[_Finish], committing: Committing
    ) -> list[list[OutboxEntry] | Failed]:
        """The ends of ``group`` in one transaction, in a few statements whatever its size.

        One SELECT of the runs, one UPDATE of the runs (executemany), one
        DELETE of their registry rows, one UPDATE of messages per outcome,
        one upsert of the rooms' sessions, one INSERT of audit rows and one
        of outbox entries: per-statement overhead, not the commit, would
        otherwise bound a group. Core
        statements, as for ``accept``: the ORM's unit of work cost more
        than the statements on this, every answer's, path.
        """

        def body(s: Session) -> list[list[OutboxEntry] | Failed]:
            # Per call: its failure, its entries (a run ended before the group),
            # or the slice of ``outbox`` it wrote (also for a second call of a
            # run this group ends: a run's pending entries are those of its end).
            placed: list[Failed | list[OutboxEntry] | tuple[int, int]] = []
            rows = s.execute(
                select(_RUNS.c.seq, _RUNS.c.id, _RUNS.c.transport, _RUNS.c.room_id, _RUNS.c.status)
                .where(_RUNS.c.id.in_({finish.run_id for finish in group}))
                # Two processes ending one run at once (replicas: the old owner and
                # the new) take turns: the second sees it ended. (SQLite: one writer.)
                .with_for_update()
            )
            runs = {RunId(r.id): r for r in rows}
            ended: dict[RunId, tuple[int, int]] = {}
            run_values: list[dict[str, Any]] = []
            audit: list[dict[str, Any]] = []
            outbox: list[dict[str, Any]] = []
            spend: list[dict[str, Any]] = []
            settle: dict[MessageState, list[RunId]] = {}
            sessions: dict[RoomKey, SessionId] = {}
            for finish in group:
                run = runs.get(finish.run_id)
                if run is None:
                    placed.append(Failed(StoreError(f"no run {finish.run_id}")))
                elif finish.run_id in ended:
                    placed.append(ended[finish.run_id])
                elif run.status != RunStatus.RUNNING.value:
                    placed.append(self._pending_entries(s, finish.run_id))
                else:
                    report, room = finish.report, _room(run.transport, run.room_id)
                    run_values.append(_ended_run_values(run.seq, finish))
                    # A run that never began: its messages wait to run, as if it never was.
                    state = (
                        MessageState.PENDING
                        if finish.requeue
                        else finished_message_state(report.status)
                    )
                    settle.setdefault(state, []).append(finish.run_id)
                    audit.append(
                        _audit_values(
                            AuditAction.RUN_FINISHED,
                            finish.at,
                            room,
                            run_id=finish.run_id,
                            detail=report.status.value,
                        )
                    )
                    if report.cost_usd is not None:
                        spend.append(_spend_values(finish, room))
                    kept = self._kept_session(finish, room)
                    if kept is not None:
                        sessions[room] = kept
                    first = len(outbox)
                    outbox += [_outbox_values(r, finish.at, finish.run_id) for r in finish.replies]
                    ended[finish.run_id] = (first, len(outbox))
                    placed.append(ended[finish.run_id])
            if run_values:
                # One executemany by primary key (Core: the ORM's bulk UPDATE cost more).
                s.execute(_END_RUN, run_values)
                # After the runs' UPDATE, which waits for a concurrent
                # register_live_run's lock: this then sees its row.
                s.execute(delete(_LIVE_RUNS).where(_LIVE_RUNS.c.run_id.in_(list(ended))))
            for state, run_ids in settle.items():
                s.execute(
                    update(_MESSAGES)
                    .where(
                        _MESSAGES.c.run_id.in_(run_ids),
                        _MESSAGES.c.state == MessageState.DISPATCHED.value,
                    )
                    .values(state=state.value)
                )
            if sessions:
                # The session in the same transaction: one disk sync for the end of a run.
                s.execute(self._sessions_upsert, _session_rows(sessions))
            if audit:
                s.execute(insert_statement(_AUDIT), audit)
            if spend:
                s.execute(insert_statement(_SPEND), spend)
            ids: list[int] = []
            if outbox:
                # One multi-row INSERT; its ids come back in the rows' order.
                returning = insert_statement(_OUTBOX).returning(
                    _OUTBOX.c.id, sort_by_parameter_order=True
                )
                ids = [new_id for (new_id,) in s.execute(returning, outbox)]
            entries = [_new_entry(v, new_id) for v, new_id in zip(outbox, ids, strict=True)]
            return [entries[p[0] : p[1]] if isinstance(p, tuple) else p for p in placed]

        return await self._write(body, committing=committing)

    def _kept_session(self, finish: _Finish, room: RoomKey) -> SessionId | None:
        """The run's session, to become the room's: asked for, and not set anew since the call."""
        if not finish.keep_session or self._session_set_at.get(room, 0) > finish.sessions_set:
            return None
        return finish.report.session_id

    def _pending_entries(self, s: Session, run_id: RunId) -> list[OutboxEntry]:
        rows = s.scalars(
            select(OutboxRow)
            .where(
                OutboxRow.run_id == run_id,
                OutboxRow.state == DeliveryState.PENDING.value,
            )
            .order_by(OutboxRow.id)
        )
        return [_outbox_entry(r) for r in rows]

    # Outbox

    def _enqueue(
        self, s: Session, replies: Sequence[Reply], at: float, run_id: RunId | None
    ) -> list[OutboxEntry]:
        rows = [_outbox_row(reply, at, run_id) for reply in replies]
        s.add_all(rows)
        if rows:
            s.flush()  # assigns the ids, in order
        return [_outbox_entry(row) for row in rows]

    async def enqueue(self, replies: Sequence[Reply], at: float) -> list[OutboxEntry]:
        """Put replies into the outbox, pending, in order."""

        def body(s: Session) -> list[OutboxEntry]:
            return self._enqueue(s, replies, at, None)

        return await self._write(body)

    async def enqueue_once(self, reply: Reply, key: str, at: float) -> list[OutboxEntry]:
        """Put ``reply`` into the outbox under ``key`` unless an entry has that key."""

        def body(s: Session) -> list[OutboxEntry]:
            if s.scalar(select(OutboxRow.id).where(OutboxRow.key == key)) is not None:
                return []
            row = _outbox_row(reply, at, None)
            row.key = key
            s.add(row)
            s.flush()
            return [_outbox_entry(row)]

        return await self._write(body)

    async def undelivered(self, room: RoomKey | None = None) -> list[OutboxEntry]:
        """Every pending outbox entry (or ``room``'s), in recording order."""
        query = select(OutboxRow).where(OutboxRow.state == DeliveryState.PENDING.value)
        if room is not None:
            query = query.where(
                OutboxRow.transport == room.transport, OutboxRow.room_id == _stored_id(room)
            )

        def body(s: Session) -> list[OutboxEntry]:
            rows = s.scalars(query.order_by(OutboxRow.id))
            return [_outbox_entry(r) for r in rows]

        return await self._read(body)

    async def _update_entry(self, entry_id: int, **values: Any) -> None:
        """Update one outbox entry; concurrent calls share a transaction (group
        commit), an unknown entry fails only its own call."""
        if self._closed:
            raise StoreError("the store is closed")
        await self._entry_updates.submit(_EntryUpdate(entry_id, values))

    async def _update_entries(
        self, group: Sequence[_EntryUpdate], committing: Committing
    ) -> list[Failed | None]:
        return await _isolating(group, self._update_entries_together, committing)

    async def _update_entries_together(
        self, group: Sequence[_EntryUpdate], committing: Committing
    ) -> list[Failed | None]:
        def body(s: Session) -> list[Failed | None]:
            outcomes: list[Failed | None] = []
            for entry in group:
                result = s.execute(
                    update(OutboxRow).where(OutboxRow.id == entry.entry_id).values(**entry.values)
                )
                missing = _rowcount(result) == 0
                error = StoreError(f"no outbox entry {entry.entry_id}")
                outcomes.append(Failed(error) if missing else None)
            return outcomes

        return await self._write(body, committing=committing)

    async def delivery_progress(self, entry_id: int, parts_done: int) -> None:
        """Record the parts of an entry delivered so far (never fewer than before)."""
        await self._update_entry(
            entry_id, parts_done=self._larger(OutboxRow.parts_done, parts_done)
        )

    async def delivery_attempted(self, entry_id: int, next_attempt_at: float) -> None:
        """Count a failed attempt and when the next is due."""
        await self._update_entry(
            entry_id, attempts=OutboxRow.attempts + 1, next_attempt_at=next_attempt_at
        )

    async def delivery_finished(self, entry_id: int, state: DeliveryState, at: float) -> None:
        """Mark an entry delivered or failed."""
        if state is DeliveryState.PENDING:
            raise ValueError("a delivery cannot finish as pending")
        await self._update_entry(entry_id, state=state.value, next_attempt_at=at)

    async def get_run(self, run_id: RunId) -> RunRecord | None:
        """The run with this id, or None."""

        def body(s: Session) -> RunRecord | None:
            runs = self._records(s, RunRow.id == run_id)
            return runs[0] if runs else None

        return await self._read(body)

    async def running_runs(self) -> list[RunRecord]:
        """Runs still marked running, oldest first."""

        def body(s: Session) -> list[RunRecord]:
            return self._records(s, RunRow.status == RunStatus.RUNNING.value)

        return await self._read(body)

    async def last_run(self, room: RoomKey) -> RunRecord | None:
        """The room's most recently started run."""

        def body(s: Session) -> RunRecord | None:
            return self._last_run(s, room)

        return await self._read(body)

    async def room_runs(self, room: RoomKey, limit: int) -> list[RunRecord]:
        """The conversation's ``limit`` most recently started runs, newest first."""
        newest = (
            select(RunRow.seq)
            .where(RunRow.transport == room.transport, RunRow.room_id == _stored_id(room))
            .order_by(RunRow.seq.desc())
            .limit(limit)
        )

        def body(s: Session) -> list[RunRecord]:
            return self._records(s, RunRow.seq.in_(newest.scalar_subquery()))[::-1]

        return await self._read(body)

    async def retryable_runs(self, room: RoomKey) -> list[RunRecord]:
        """The room's offered runs, oldest first (the rule is in the protocol)."""

        def body(s: Session) -> list[RunRecord]:
            return self._records(
                s,
                (RunRow.transport == room.transport)
                & (RunRow.room_id == _stored_id(room))
                & _offered(),
            )

        return await self._read(body)

    async def requeue_run(self, run_id: RunId) -> list[Message]:
        """Mark pending the messages that failed with this run as their last, while the
        run is offered (the rule of :meth:`retryable_runs`).

        One conditional UPDATE: of two concurrent retries of a run, one
        re-queues the messages and the other finds none.
        """
        return await self._write(lambda s: _requeue(s, run_id))

    def _last_run(self, s: Session, room: RoomKey) -> RunRecord | None:
        last = s.scalar(
            select(func.max(RunRow.seq)).where(
                RunRow.transport == room.transport, RunRow.room_id == _stored_id(room)
            )
        )
        if last is None:
            return None
        runs = self._records(s, RunRow.seq == last)
        return runs[0]

    def _records(self, s: Session, where: ColumnElement[bool]) -> list[RunRecord]:
        runs = s.scalars(select(RunRow).where(where).order_by(RunRow.seq)).all()
        if not runs:
            return []
        links = s.execute(
            select(RunMessageRow.run_id, RunMessageRow.message_id)
            .where(RunMessageRow.run_id.in_([r.id for r in runs]))
            .order_by(RunMessageRow.run_id, RunMessageRow.position)
        )
        members: dict[str, list[MessageId]] = {}
        for run_id, message_id in links:
            members.setdefault(run_id, []).append(MessageId(message_id))
        return [_run_record(r, tuple(members.get(r.id, ()))) for r in runs]

    # Sessions

    async def get_session(self, room: RoomKey) -> SessionId | None:
        """The Claude session the room resumes, if any."""

        def body(s: Session) -> SessionId | None:
            row = s.get(RoomRow, (room.transport, _stored_id(room)))
            return None if row is None or row.session_id is None else SessionId(row.session_id)

        return await self._read(body)

    async def set_session(self, room: RoomKey, session_id: SessionId | None) -> None:
        """Remember (or, with None, forget) the Claude session of a room.

        It wins over the session of a run whose :meth:`finish_run` was called
        before and has not committed yet (see there).
        """
        # Counted before any await: a finish_run called from now on sees it.
        self._sessions_set += 1
        self._session_set_at[room] = self._sessions_set

        def body(s: Session) -> None:
            s.execute(self._sessions_upsert, _session_rows({room: session_id}))
            if session_id is None:
                # A forgotten session is never resumed: its transcript goes with it.
                s.execute(delete(SessionTranscriptRow).where(*_transcript_of(room)))

        async with self._session_writes:
            await self._write(body)

    @functools.cached_property
    def _sessions_upsert(self) -> Any:
        """Setting rooms' sessions (``set_session``, and the runs a group ends), for an
        executemany of :func:`_session_rows`: built and compiled once (a multi-row
        VALUES is compiled anew for each number of rows)."""
        upsert = self._insert(RoomRow)
        return upsert.on_conflict_do_update(
            index_elements=["transport", "room_id"],
            set_={"session_id": upsert.excluded.session_id},
        )

    # Session transcripts

    async def save_transcript(
        self,
        room: RoomKey,
        session_id: SessionId,
        content: bytes,
        at: float,
        stamp: TranscriptStamp,
    ) -> None:
        """Keep the conversation's transcript of ``session_id`` in place of the one it kept.

        Synced: a lost save could leave an older copy of the same session, which
        another replica would resume without the latest turns.
        """
        values = {
            "session_id": session_id,
            "content": content,
            "size": stamp.size,
            "digest": stamp.digest,
            "saved_at": at,
        }
        upsert = self._insert(SessionTranscriptRow).values(
            transport=room.transport, room_id=_stored_id(room), **values
        )
        upsert = upsert.on_conflict_do_update(index_elements=["transport", "room_id"], set_=values)

        def body(s: Session) -> None:
            s.execute(upsert)

        await self._write(body)

    async def transcript_stamp(
        self, room: RoomKey, session_id: SessionId
    ) -> TranscriptStamp | None:
        """The stored transcript's stamp, if it is ``session_id``'s (its content stays put)."""
        query = select(SessionTranscriptRow.size, SessionTranscriptRow.digest).where(
            *_transcript_of(room), SessionTranscriptRow.session_id == session_id
        )

        def body(s: Session) -> TranscriptStamp | None:
            row = (s.execute(query)).first()
            return None if row is None else TranscriptStamp(row.size, row.digest)

        return await self._read(body)

    async def load_transcript(self, room: RoomKey, session_id: SessionId) -> bytes | None:
        """The stored transcript's content, if it is ``session_id``'s."""
        query = select(SessionTranscriptRow.content).where(
            *_transcript_of(room), SessionTranscriptRow.session_id == session_id
        )

        def body(s: Session) -> bytes | None:
            content: bytes | None = s.scalar(query)
            return content

        return await self._read(body)

    async def drop_transcript(self, room: RoomKey) -> None:
        """Forget the conversation's stored transcript."""

        def body(s: Session) -> None:
            s.execute(delete(SessionTranscriptRow).where(*_transcript_of(room)))

        await self._write(body)

    # Schedules

    async def schedule_marks(self) -> dict[str, float]:
        """Each schedule's latest firing time dealt with, by name."""

        def body(s: Session) -> dict[str, float]:
            rows = s.execute(select(ScheduleMarkRow.name, ScheduleMarkRow.fired_at))
            return {name: fired_at for name, fired_at in rows}

        return await self._read(body)

    async def mark_schedule(self, name: str, fired_at: float) -> None:
        """Record a firing as dealt with; marks never go back (two replicas may both write)."""
        upsert = self._insert(ScheduleMarkRow).values(name=name, fired_at=fired_at)
        upsert = upsert.on_conflict_do_update(
            index_elements=["name"],
            set_={"fired_at": upsert.excluded.fired_at},
            where=ScheduleMarkRow.fired_at < upsert.excluded.fired_at,
        )

        def body(s: Session) -> None:
            s.execute(upsert)

        await self._write(body)

    # Room overrides

    async def room_overrides(self, room: RoomKey) -> RoomOverrides:
        """The model and permission mode set by command for the room, if any."""
        return (await self.room_state(room))[1]

    async def room_state(self, room: RoomKey) -> tuple[SessionId | None, RoomOverrides]:
        """The room's session and overrides: one row, one read."""

        def body(s: Session) -> tuple[SessionId | None, RoomOverrides]:
            row = s.get(RoomRow, (room.transport, _stored_id(room)))
            if row is None:
                return None, RoomOverrides()
            session = None if row.session_id is None else SessionId(row.session_id)
            return session, RoomOverrides(row.model, row.permission_mode, row.fork_next)

        return await self._read(body)

    async def set_room_model(self, room: RoomKey, model: str | None) -> None:
        """Set (None: clear) the model of the room's next runs."""

        def body(s: Session) -> None:
            s.execute(self._room_upsert(room, model=model))

        await self._write(body)

    async def set_room_mode(self, room: RoomKey, mode: str | None) -> None:
        """Set (None: clear) the permission mode of the room's next runs."""

        def body(s: Session) -> None:
            s.execute(self._room_upsert(room, permission_mode=mode))

        await self._write(body)

    async def set_room_fork(self, room: RoomKey, fork: bool) -> None:
        """Whether the room's next run forks its session."""

        def body(s: Session) -> None:
            s.execute(self._room_upsert(room, fork_next=fork))

        await self._write(body)

    def _room_upsert(self, room: RoomKey, **values: Any) -> Any:
        """The room's row with ``values`` set, created if missing; its other columns kept."""
        upsert = self._insert(RoomRow).values(
            transport=room.transport, room_id=_stored_id(room), **values
        )
        return upsert.on_conflict_do_update(index_elements=["transport", "room_id"], set_=values)

    # Budgets and usage limits

    async def spend(self, since: float, room: RoomKey | None = None) -> float:
        """USD the runs that ended at or after ``since`` cost (in ``room``, or everywhere)."""
        query = select(func.coalesce(func.sum(SpendRow.cost_usd), 0.0)).where(SpendRow.at >= since)
        if room is not None:
            query = query.where(
                SpendRow.transport == room.transport, SpendRow.room_id == room.room_id
            )

        def body(s: Session) -> float:
            return float(s.scalar(query) or 0.0)

        return await self._read(body)

    async def add_limit_resume(self, run_id: RunId, room: RoomKey, resets_at: float) -> None:
        """Note a retry of ``run_id`` at ``resets_at`` (the first note stands)."""

        def body(s: Session) -> None:
            s.execute(
                self._insert(LimitResumeRow)
                .values(
                    run_id=run_id,
                    transport=room.transport,
                    room_id=_stored_id(room),
                    resets_at=resets_at,
                )
                .on_conflict_do_nothing(index_elements=["run_id"])
            )

        await self._write(body)

    async def limit_resumes(self) -> list[LimitResume]:
        """The waiting retries, earliest first."""

        def body(s: Session) -> list[LimitResume]:
            rows = s.scalars(
                select(LimitResumeRow).order_by(LimitResumeRow.resets_at, LimitResumeRow.run_id)
            )
            return [
                LimitResume(RunId(r.run_id), _room(r.transport, r.room_id), r.resets_at)
                for r in rows
            ]

        return await self._read(body)

    async def drop_limit_resume(self, run_id: RunId) -> bool:
        """Forget the waiting retry of ``run_id``; whether there was one."""

        def body(s: Session) -> bool:
            result = s.execute(delete(LimitResumeRow).where(LimitResumeRow.run_id == run_id))
            return _rowcount(result) > 0

        return await self._write(body)

    async def requeue_limit_resume(self, run_id: RunId) -> list[Message] | None:
        """Forget the waiting retry and re-queue its run's messages, in one transaction
        (the delete's row lock orders it against a concurrent call-off); None if none
        waited."""

        def body(s: Session) -> list[Message] | None:
            result = s.execute(delete(LimitResumeRow).where(LimitResumeRow.run_id == run_id))
            if _rowcount(result) == 0:
                return None
            return _requeue(s, run_id)

        return await self._write(body)

    # Approvals

    async def add_approval(
        self,
        room: RoomKey,
        run_id: RunId,
        request_id: str,
        *,
        tool_name: str,
        input_json: str,
        asked_at: float,
        expires_at: float,
        shown_digest: str = "",
    ) -> Approval:
        """Record a pending request under the room's next number; a replay returns the first.

        The number comes from the room's counter, raised in the same
        transaction: the upsert locks the room's row, so concurrent requests
        of a room (even from two stores) get distinct numbers.
        """

        def body(s: Session) -> Approval:
            existing = self._approval_of_request(s, run_id, request_id)
            if existing is not None:
                return existing
            counter = self._insert(RoomRow).values(
                transport=room.transport, room_id=_stored_id(room), last_approval=1
            )
            number = s.scalar(
                counter.on_conflict_do_update(
                    index_elements=["transport", "room_id"],
                    set_={"last_approval": RoomRow.last_approval + 1},
                ).returning(RoomRow.last_approval)
            )
            if number is None:  # an upsert returns its row; never seen
                raise StoreError("the room's approval counter returned nothing")
            # DO NOTHING: the same request recorded meanwhile (another store
            # replaying it) is found below, not an integrity error.
            inserted = s.scalar(
                self._insert(ApprovalRow)
                .values(
                    transport=room.transport,
                    room_id=_stored_id(room),
                    number=number,
                    run_id=run_id,
                    request_id=request_id,
                    tool_name=tool_name,
                    input_json=input_json,
                    asked_at=asked_at,
                    expires_at=expires_at,
                    state=ApprovalState.PENDING.value,
                    reason="",
                    shown_digest=shown_digest,
                )
                .on_conflict_do_nothing(index_elements=["run_id", "request_id"])
                .returning(ApprovalRow.id)
            )
            approval = self._approval_of_request(s, run_id, request_id)
            if approval is None:  # inserted, or found by the insert: never seen
                raise StoreError(f"approval request {request_id} vanished")
            if inserted is not None:
                s.add(
                    _audit_row(
                        AuditAction.APPROVAL_ASKED,
                        asked_at,
                        room=room,
                        run_id=run_id,
                        detail=approval_detail(approval, ApprovalState.PENDING),
                    )
                )
            return approval

        return await self._write(body)

    def _approval_of_request(self, s: Session, run_id: RunId, request_id: str) -> Approval | None:
        row = s.scalar(
            select(ApprovalRow).where(
                ApprovalRow.run_id == run_id, ApprovalRow.request_id == request_id
            )
        )
        return None if row is None else _approval(row)

    async def set_approval_message(self, approval: Approval, message_id: ExternalMessageId) -> None:
        """Remember the room message that asks."""

        def body(s: Session) -> None:
            s.execute(
                update(ApprovalRow)
                .where(ApprovalRow.id == approval.id)
                .values(message_id=message_id)
            )

        await self._write(body)

    async def pending_approvals(self, room: RoomKey | None = None) -> list[Approval]:
        """Pending requests, of one room or of all, oldest first."""
        where = [ApprovalRow.state == ApprovalState.PENDING.value]
        if room is not None:
            where += [
                ApprovalRow.transport == room.transport,
                ApprovalRow.room_id == _stored_id(room),
            ]
        return await self._approvals(*where)

    async def approval_by_number(self, room: RoomKey, number: int) -> Approval | None:
        """The room's request with this number, whatever its state."""
        if not 0 < number <= _MAX_NUMBER:
            return None  # no such row, and a bound parameter PostgreSQL could not take
        found = await self._approvals(
            ApprovalRow.transport == room.transport,
            ApprovalRow.room_id == _stored_id(room),
            ApprovalRow.number == number,
        )
        return found[0] if found else None

    async def approval_by_message(
        self, room: RoomKey, message_id: ExternalMessageId
    ) -> Approval | None:
        """The room's request asked by this message, whatever its state."""
        found = await self._approvals(
            ApprovalRow.transport == room.transport,
            _in_room(ApprovalRow.room_id, room),
            ApprovalRow.message_id == message_id,
        )
        return found[0] if found else None

    async def _approvals(self, *where: ColumnElement[bool]) -> list[Approval]:
        def body(s: Session) -> list[Approval]:
            rows = s.scalars(select(ApprovalRow).where(*where).order_by(ApprovalRow.id))
            return [_approval(r) for r in rows]

        return await self._read(body)

    async def decide_approval(
        self,
        approval: Approval,
        state: ApprovalState,
        decided_by: UserId | None,
        decided_at: float,
        reason: str = "",
        *,
        rule_id: int | None = None,
    ) -> bool:
        """Decide the request if it is still pending and its rule (if any) holds (one
        conditional UPDATE), audited."""
        require_decision(state)
        reason = approval_reason(reason)
        holds = []
        if rule_id is not None:
            if not 0 < rule_id <= _MAX_NUMBER:
                return False
            rule = select(ToolRuleRow.id).where(
                ToolRuleRow.id == rule_id, ToolRuleRow.revoked_at.is_(None)
            )
            holds.append(rule.exists())

        def body(s: Session) -> bool:
            decided = s.scalar(
                update(ApprovalRow)
                .where(
                    ApprovalRow.id == approval.id,
                    ApprovalRow.state == ApprovalState.PENDING.value,
                    *holds,
                )
                .values(
                    state=state.value,
                    decided_by=decided_by,
                    decided_at=decided_at,
                    reason=reason,
                )
                .returning(ApprovalRow.id)
            )
            if decided is None:
                return False
            s.add(
                _audit_row(
                    APPROVAL_ACTIONS[state],
                    decided_at,
                    room=approval.room,
                    actor=decided_by,
                    run_id=approval.run_id,
                    detail=approval_detail(approval, state, reason),
                )
            )
            return True

        return await self._write(body)

    async def cancel_approvals(
        self, run_id: RunId, why: str, at: float, request_ids: tuple[str, ...] | None = None
    ) -> list[Approval]:
        """Cancel the run's pending requests (or those of ``request_ids``), one audit row each."""
        why = approval_reason(why)
        which = [ApprovalRow.run_id == run_id, ApprovalRow.state == ApprovalState.PENDING.value]
        if request_ids is not None:
            which.append(ApprovalRow.request_id.in_(list(request_ids)))

        def body(s: Session) -> list[Approval]:
            rows = (
                s.scalars(
                    update(ApprovalRow)
                    .where(*which)
                    .values(state=ApprovalState.CANCELLED.value, decided_at=at, reason=why)
                    .returning(ApprovalRow)
                )
            ).all()
            cancelled = [_approval(r) for r in sorted(rows, key=lambda r: r.id)]
            for approval in cancelled:
                s.add(
                    _audit_row(
                        AuditAction.APPROVAL_CANCELLED,
                        at,
                        room=approval.room,
                        run_id=run_id,
                        detail=approval_detail(approval, ApprovalState.CANCELLED, why),
                    )
                )
            return cancelled

        return await self._write(body)

    async def expired_approvals(self, now: float) -> list[Approval]:
        """Pending requests due to expire, oldest first (they stay pending)."""
        return await self._approvals(
            ApprovalRow.state == ApprovalState.PENDING.value, ApprovalRow.expires_at <= now
        )

    # Audit

    # Tool rules

    async def add_rule(
        self,
        room: RoomKey,
        *,
        scope: RuleScope,
        effect: RuleEffect,
        rule: str,
        session_id: SessionId | None,
        created_by: UserId,
        at: float,
    ) -> ToolRule:
        """Keep a rule for the room's channel, audited, in one transaction."""
        require_rule(scope, session_id, rule)
        channel = room.channel

        def body(s: Session) -> ToolRule:
            row = ToolRuleRow(
                transport=channel.transport,
                room_id=_stored_id(channel),
                scope=scope.value,
                session_id=session_id,
                effect=effect.value,
                rule=rule,
                created_by=created_by,
                created_at=at,
            )
            s.add(row)
            s.flush()
            kept = _tool_rule(row)
            s.add(
                _audit_row(
                    AuditAction.RULE_ADDED,
                    at,
                    room=channel,
                    actor=created_by,
                    detail=rule_detail(kept),
                )
            )
            return kept

        return await self._write(body)

    async def active_rules(self, room: RoomKey, session_id: SessionId | None) -> list[ToolRule]:
        """The channel's unrevoked room rules and ``session_id``'s, oldest first."""
        channel = room.channel
        scoped = ToolRuleRow.scope == RuleScope.ROOM.value
        if session_id is not None:
            scoped = scoped | (ToolRuleRow.session_id == session_id)
        query = (
            select(ToolRuleRow)
            .where(
                ToolRuleRow.transport == channel.transport,
                ToolRuleRow.room_id == _stored_id(channel),
                ToolRuleRow.revoked_at.is_(None),
                scoped,
            )
            .order_by(ToolRuleRow.id)
        )

        def body(s: Session) -> list[ToolRule]:
            return [_tool_rule(row) for row in s.scalars(query)]

        return await self._read(body)

    async def revoke_rule(
        self, room: RoomKey, rule_id: int, actor: UserId, at: float
    ) -> ToolRule | None:
        """End an unrevoked rule of the channel (one conditional UPDATE), audited."""
        channel = room.channel
        if not 0 < rule_id <= _MAX_NUMBER:
            return None  # no such id, and the driver would refuse the query

        def body(s: Session) -> ToolRule | None:
            row = s.scalars(
                update(ToolRuleRow)
                .where(
                    ToolRuleRow.id == rule_id,
                    ToolRuleRow.transport == channel.transport,
                    ToolRuleRow.room_id == _stored_id(channel),
                    ToolRuleRow.revoked_at.is_(None),
                )
                .values(revoked_by=actor, revoked_at=at)
                .returning(ToolRuleRow)
            ).one_or_none()
            if row is None:
                return None
            revoked = _tool_rule(row)
            s.add(
                _audit_row(
                    AuditAction.RULE_REVOKED,
                    at,
                    room=channel,
                    actor=actor,
                    detail=rule_detail(revoked),
                )
            )
            return revoked

        return await self._write(body)

    async def audit(
        self,
        action: AuditAction,
        at: float,
        *,
        room: RoomKey | None = None,
        actor: UserId | None = None,
        message_id: MessageId | None = None,
        run_id: RunId | None = None,
        detail: str = "",
    ) -> None:
        """Append one audit row."""

        def body(s: Session) -> None:
            s.add(
                _audit_row(
                    action,
                    at,
                    room=room,
                    actor=actor,
                    message_id=message_id,
                    run_id=run_id,
                    detail=detail,
                )
            )

        await self._write(body)

    async def audit_trail(
        self,
        *,
        room: RoomKey | None = None,
        message_id: MessageId | None = None,
        run_id: RunId | None = None,
    ) -> list[AuditRecord]:
        """Audit rows matching every given filter, in the order they were written."""
        conditions: list[ColumnElement[bool]] = []
        if room is not None:
            conditions += [
                AuditRow.transport == room.transport,
                AuditRow.room_id == _stored_id(room),
            ]
        if message_id is not None:
            conditions.append(AuditRow.message_id == message_id)
        if run_id is not None:
            conditions.append(AuditRow.run_id == run_id)

        def body(s: Session) -> list[AuditRecord]:
            rows = s.scalars(select(AuditRow).where(*conditions).order_by(AuditRow.id))
            return [_audit_record(r) for r in rows]

        return await self._read(body)

    # Retention

    # Seen marks

    async def seen_marks(self, transport: TransportName) -> dict[RoomKey, ExternalMessageId]:
        """The newest message ``transport`` saw in each room and thread."""

        def body(s: Session) -> dict[RoomKey, ExternalMessageId]:
            query = select(SeenMarkRow.room_id, SeenMarkRow.last_id).where(
                SeenMarkRow.transport == transport
            )
            return {
                _room(transport, room_id): ExternalMessageId(last_id)
                for room_id, last_id in s.execute(query)
            }

        return await self._read(body)

    async def mark_seen(self, marks: Mapping[RoomKey, ExternalMessageId], at: float) -> None:
        """Record the marks in one transaction; marks never go back (two replicas may
        both write)."""
        if not marks:
            return
        # One statement per mark: a multi-row upsert's conflict clause cannot keep
        # the larger id per row on both SQLite and PostgreSQL alike.
        upserts = []
        for room, last in sorted(marks.items()):
            upsert = self._insert(SeenMarkRow).values(
                transport=room.transport, room_id=_stored_id(room), last_id=last, seen_at=at
            )
            upserts.append(
                upsert.on_conflict_do_update(
                    index_elements=["transport", "room_id"],
                    set_={"last_id": upsert.excluded.last_id, "seen_at": upsert.excluded.seen_at},
                    where=SeenMarkRow.last_id < upsert.excluded.last_id,
                )
            )

        def body(s: Session) -> None:
            for upsert in upserts:
                s.execute(upsert)

        await self._write(body)

    async def prune(self, older_than: float) -> int:
        """Delete old audit rows, old finished messages and runs left empty.

        Messages still pending or dispatched and running runs are kept
        whatever their age. A finished run is deleted once it ended before
        the cutoff and none of its messages remain. Outbox entries and
        approvals finished before the cutoff go too. Returns the number of
        rows deleted.
        """

        def body(s: Session) -> int:
            audit = s.execute(delete(AuditRow).where(AuditRow.at < older_than))
            messages = s.execute(
                delete(MessageRow).where(
                    MessageRow.received_at < older_than, MessageRow.state.not_in(_LIVE)
                )
            )
            runs = s.execute(
                delete(RunRow).where(
                    RunRow.status != RunStatus.RUNNING.value,
                    RunRow.ended_at < older_than,
                    # run_messages rows vanish with their messages (ON DELETE CASCADE);
                    # a live_runs row, which a run that ended no longer has,
                    # would vanish with its run.
                    ~exists().where(RunMessageRow.run_id == RunRow.id),
                )
            )
            # A finished entry's next_attempt_at is when it finished.
            outbox = s.execute(
                delete(OutboxRow).where(
                    OutboxRow.state != DeliveryState.PENDING.value,
                    OutboxRow.next_attempt_at < older_than,
                )
            )
            approvals = s.execute(
                delete(ApprovalRow).where(
                    ApprovalRow.state != ApprovalState.PENDING.value,
                    ApprovalRow.decided_at < older_than,
                )
            )
            spend = s.execute(delete(SpendRow).where(SpendRow.at < older_than))
            # Threads' marks only: a room's own is where its catch-up starts.
            marks = s.execute(
                delete(SeenMarkRow).where(
                    SeenMarkRow.room_id.contains(THREAD_SEPARATOR, autoescape=True),
                    SeenMarkRow.seen_at < older_than,
                )
            )
            counts = (audit, messages, runs, outbox, approvals, spend, marks)
            return sum(_rowcount(c) for c in counts)

        return await self._write(body)

    # Lifecycle

    async def ping(self) -> None:
        """Raise StoreError unless the database answers."""

        def body(s: Session) -> None:
            s.execute(text("SELECT 1"))

        await self._read(body)

    async def close(self) -> None:
        """Close every pooled connection and refuse further use."""
        self._closed = True
        self._accepts.fail_queued(lambda: StoreError("the store is closed"))
        self._finishes.fail_queued(lambda: StoreError("the store is closed"))
        self._entry_updates.fail_queued(lambda: StoreError("the store is closed"))
        # A connection still checked out when the pool is disposed is never
        # closed properly: let the transactions in flight end first.
        await self._accepts.idle()
        await self._finishes.idle()
        await self._entry_updates.idle()
        await self._tx.close()
        await self._engine.dispose()


async def _isolating(
    group: Sequence[_ItemT],
    together: Callable[[Sequence[_ItemT], Committing], Awaitable[Sequence[_ResultT | Failed]]],
    committing: Committing,
) -> list[_ResultT | Failed]:
    """Write ``group`` in one transaction through ``together``.

    If the database refuses the group's data (not a lost connection or a
    lock), each item goes again alone, so that an item it refuses fails
    only its own caller, as without group commit.
    """
    try:
        return list(await together(group, committing))
    except StoreError as exc:
        if len(group) == 1 or not _refused_data(exc):
            raise
    # Commits follow: from here on the leader must not cut this short.
    committing()
    outcomes: list[_ResultT | Failed] = []
    for item in group:
        try:
            outcomes += await together([item], committing)
        except StoreError as exc:
            outcomes.append(Failed(exc))
    return outcomes


def _require_head(url: str, found: str | None) -> None:
    expected = head_revision()
    newer = newer_schema(found)
    if newer is not None:
        # `chatbridge migrate` cannot help: it would refuse the same way.
        raise StoreError(newer)
    if found != expected:
        raise StoreError(
            f"the database at {redacted(url)} is at schema revision {found or 'none'},"
            f" this version needs {expected}: run `chatbridge migrate`"
        )


def _refused_data(error: StoreError) -> bool:
    """Whether the database refused what was sent, rather than failing to take it.

    A lost connection, a lock or a timeout would fail each message again.
    """
    cause = error.__cause__
    if isinstance(cause, UnicodeError):
        return True
    return (
        isinstance(cause, DBAPIError)
        and not cause.connection_invalidated
        and not isinstance(cause, OperationalError | InterfaceError)
    )


def _rowcount(result: Any) -> int:
    # Result of an UPDATE/DELETE; typed loosely in SQLAlchemy's stubs.
    count: int = result.rowcount
    return count


def _transcript_of(room: RoomKey) -> tuple[ColumnElement[bool], ...]:
    """The conditions picking the conversation's row of ``session_transcripts``."""
    return (
        SessionTranscriptRow.transport == room.transport,
        SessionTranscriptRow.room_id == _stored_id(room),
    )


def _in_room(column: Mapped[str], room: RoomKey) -> ColumnElement[bool]:
    """``column`` is ``room``'s room or one of its thread conversations: what a
    transport names by the room and a message id (an edit, a click) is found in
    whichever conversation holds it."""
    prefix = room.room_id + THREAD_SEPARATOR
    # A comparison, not LIKE: SQLite's LIKE ignores case, and room ids are
    # case-sensitive (Matrix's); nothing in them is read as a pattern either.
    return or_(column == room.room_id, func.substr(column, 1, len(prefix)) == prefix)


def _message_values(msg: InboundMessage, received_at: float) -> dict[str, Any]:
    return {
        "transport": msg.room.transport,
        "room_id": _stored_id(msg.room),
        "external_id": msg.external_id,
        "sender": msg.sender,
        "text": msg.text,
        "thread": msg.thread,
        "received_at": received_at,
        "state": MessageState.PENDING.value,
        "attachments": _attachments_json(msg.attachments),
        "sender_name": msg.sender_name,
        "reply_to_text": msg.reply_to_text,
    }


def _attachments_json(attachments: Sequence[Attachment]) -> list[dict[str, Any]] | None:
    if not attachments:
        return None
    return [{"name": a.name, "mime": a.mime, "size": a.size, "ref": a.ref} for a in attachments]


def _attachments(stored: list[dict[str, Any]] | None) -> tuple[Attachment, ...]:
    return tuple(
        Attachment(
            name=str(a["name"]),
            mime=str(a["mime"]),
            size=None if a.get("size") is None else int(a["size"]),
            ref=str(a["ref"]),
        )
        for a in stored or ()
    )


def _key(msg: InboundMessage) -> tuple[str, str, str]:
    """What makes a message a redelivery: transport, room and external id."""
    return (msg.room.transport, _stored_id(msg.room), msg.external_id)


def _audit_values(
    action: AuditAction,
    at: float,
    room: RoomKey,
    *,
    message_id: int | None = None,
    run_id: str | None = None,
    detail: str = "",
) -> dict[str, Any]:
    """An audit row for a Core INSERT (no actor: the bridge itself acted)."""
    return {
        "at": at,
        "action": action.value,
        "transport": room.transport,
        "room_id": _stored_id(room),
        "actor": None,
        "message_id": message_id,
        "run_id": run_id,
        "detail": detail,
    }


def _accepted_audit_values(
    msg: InboundMessage, received_at: float, message_id: int
) -> dict[str, Any]:
    return {
        "at": received_at,
        "action": AuditAction.MESSAGE_ACCEPTED.value,
        "transport": msg.room.transport,
        "room_id": _stored_id(msg.room),
        "actor": msg.sender,
        "message_id": message_id,
        "run_id": None,
        "detail": "",
    }


def _outbox_row(reply: Reply, at: float, run_id: RunId | None) -> OutboxRow:
    return OutboxRow(
        transport=reply.room.transport,
        room_id=_stored_id(reply.room),
        run_id=run_id,
        text=reply.text,
        kind=reply.kind.value,
        in_reply_to=reply.in_reply_to,
        thread=reply.thread,
        anchor=reply.anchor,
        file=reply.file,
        key=delivery_key(),
        parts_done=0,
        attempts=0,
        next_attempt_at=at,
        state=DeliveryState.PENDING.value,
        created=at,
    )


def _requeue(s: Session, run_id: RunId) -> list[Message]:
    """Mark pending the messages that failed with ``run_id`` as their last, while it is
    offered (:func:`_offered`); them, in order. One conditional UPDATE: of two concurrent
    re-queues of a run, one takes the messages and the other finds none."""
    offered = select(RunRow.id).where(RunRow.id == run_id, _offered())
    rows = (
        s.scalars(
            update(MessageRow)
            .where(
                MessageRow.run_id == run_id,
                MessageRow.state == MessageState.FAILED.value,
                exists(offered),
            )
            .values(state=MessageState.PENDING.value)
            .returning(MessageRow)
        )
    ).all()
    return [_message(r) for r in sorted(rows, key=lambda r: r.id)]


def _offered() -> ColumnElement[bool]:
    """The rule of the retry offer (``Store.retryable_runs``), on :class:`RunRow`: a
    retryable status, messages still failed with it, and no later successful run of
    the room with a message received after it ended."""
    later = aliased(RunRow)
    link = aliased(RunMessageRow)
    newer = aliased(MessageRow)
    still_failed = exists().where(
        MessageRow.run_id == RunRow.id,
        MessageRow.state == MessageState.FAILED.value,
    )
    superseded = exists().where(
        later.transport == RunRow.transport,
        later.room_id == RunRow.room_id,
        later.seq > RunRow.seq,
        later.status == RunStatus.SUCCEEDED.value,
        link.run_id == later.id,
        newer.id == link.message_id,
        newer.received_at > func.coalesce(RunRow.ended_at, RunRow.started_at),
    )
    retryable = [str(status) for status in RunStatus if status.retryable]
    return RunRow.status.in_(retryable) & still_failed & ~superseded


def _spend_values(finish: _Finish, room: RoomKey) -> dict[str, Any]:
    """The run's row of the budget ledger: by room (a thread's cost is its room's)."""
    return {
        "run_id": finish.run_id,
        "transport": room.transport,
        "room_id": room.room_id,
        "at": finish.at,
        "cost_usd": finish.report.cost_usd,
    }


_END_RUN = update(_RUNS).where(_RUNS.c.seq == bindparam("b_seq"))
"""A run's outcome by primary key: the SET clause is the other keys of
:func:`_ended_run_values`."""


def _ended_run_values(seq: int, finish: _Finish) -> dict[str, Any]:
    """A run's outcome, for :data:`_END_RUN`."""
    report = finish.report
    return {
        "b_seq": seq,
        "status": report.status.value,
        "ended_at": finish.at,
        "exit_code": report.exit_code,
        "session_id": report.session_id,
        "cost_usd": report.cost_usd,
        "num_turns": report.num_turns,
        "duration_ms": report.duration_ms,
        "session_not_found": report.session_not_found,
        "result_excerpt": excerpt(report.result_text),
        "error_excerpt": excerpt(report.error),
    }


def _session_rows(sessions: Mapping[RoomKey, SessionId | None]) -> list[dict[str, Any]]:
    """Rooms' sessions (None: forgotten), for :attr:`SqlStore._sessions_upsert` (each
    room once)."""
    return [
        {"transport": room.transport, "room_id": _stored_id(room), "session_id": session}
        for room, session in sessions.items()
    ]


def _outbox_values(reply: Reply, at: float, run_id: RunId | None) -> dict[str, Any]:
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


def _new_entry(values: dict[str, Any], new_id: int) -> OutboxEntry:
    """The entry just inserted with ``values`` (from :func:`_outbox_values`)."""
    return _outbox_entry(OutboxRow(id=new_id, **values))


def _outbox_entry(row: OutboxRow) -> OutboxEntry:
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


def _message(row: MessageRow) -> Message:
    return Message(
        id=MessageId(row.id),
        room=_room(row.transport, row.room_id),
        sender=UserId(row.sender),
        text=row.text,
        external_id=ExternalMessageId(row.external_id),
        received_at=row.received_at,
        thread=row.thread,
        attachments=_attachments(row.attachments),
        sender_name=row.sender_name,
        reply_to_text=row.reply_to_text,
    )


def _dispatch_into(
    s: Session, run_id: RunId, batch: Batch, at: float, *, first: int, detail: str = ""
) -> list[dict[str, Any]]:
    """Mark the batch's messages dispatched into the run, at positions from ``first``;
    their audit rows (``message_dispatched``), for the caller to insert with its own."""
    ids = list(batch.ids)
    found = s.execute(
        update(_MESSAGES)
        .where(_MESSAGES.c.id.in_(ids))
        .values(state=MessageState.DISPATCHED.value, run_id=run_id)
    )
    if _rowcount(found) != len(set(ids)):
        raise StoreError(f"run {run_id}: some of messages {ids} do not exist")
    s.execute(
        insert_statement(_RUN_MESSAGES),
        [
            {"run_id": run_id, "message_id": message_id, "position": first + i}
            for i, message_id in enumerate(ids)
        ],
    )
    dispatched = AuditAction.MESSAGE_DISPATCHED
    return [
        _audit_values(dispatched, at, batch.room, message_id=m, run_id=run_id, detail=detail)
        for m in ids
    ]


def _run_record(row: RunRow, message_ids: tuple[MessageId, ...]) -> RunRecord:
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


def _registered_run(row: LiveRunRow) -> RegisteredRun:
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


def _audit_row(
    action: AuditAction,
    at: float,
    *,
    room: RoomKey | None = None,
    actor: UserId | None = None,
    message_id: int | None = None,
    run_id: str | None = None,
    detail: str = "",
) -> AuditRow:
    return AuditRow(
        at=at,
        action=action.value,
        transport=None if room is None else room.transport,
        room_id=None if room is None else _stored_id(room),
        actor=actor,
        message_id=message_id,
        run_id=run_id,
        detail=detail,
    )


def _audit_record(row: AuditRow) -> AuditRecord:
    room = None
    if row.transport is not None and row.room_id is not None:
        room = _room(row.transport, row.room_id)
    return AuditRecord(
        id=row.id,
        at=row.at,
        action=AuditAction(row.action),
        room=room,
        actor=None if row.actor is None else UserId(row.actor),
        message_id=None if row.message_id is None else MessageId(row.message_id),
        run_id=None if row.run_id is None else RunId(row.run_id),
        detail=row.detail,
    )


def _approval(row: ApprovalRow) -> Approval:
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


def _tool_rule(row: ToolRuleRow) -> ToolRule:
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

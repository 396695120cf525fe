"""The SQL store's :class:`~bridge.store.base.RunStore`: runs started, steered, ended, retried.

``finish_run`` shares transactions between concurrent calls (group commit); which
commits are synced: docs/operations.md, "How the store writes".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, delete, exists, func, select, update
from sqlalchemy import insert as insert_statement
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session, aliased

from bridge.core.model import (
    Batch,
    Message,
    MessageId,
    MessageState,
    RoomKey,
    RunId,
    RunStatus,
    SessionId,
)
from bridge.store import audit_entries
from bridge.store.base import (
    STEERED,
    DeliveryState,
    Fence,
    OutboxEntry,
    RunEnding,
    RunRecord,
    StoreError,
)
from bridge.store.batching import Committing, Failed, GroupCommit
from bridge.store.cluster import check_fence
from bridge.store.keys import room_key as _room
from bridge.store.keys import stored_id as _stored_id
from bridge.store.rules import kept_report, settled_state
from bridge.store.sql.rows import (
    audit_values,
    new_entry,
    outbox_values,
    session_rows,
    to_message,
    to_outbox_entry,
    to_run_record,
)
from bridge.store.sql.shared import (
    AUDIT,
    LIVE_RUNS,
    MESSAGES,
    OUTBOX,
    RUN_MESSAGES,
    RUNS,
    SPEND,
    SqlBase,
    isolating,
    of_conversation,
    rowcount,
)
from bridge.store.tables import MessageRow, OutboxRow, RunMessageRow, RunRow

FINISH_GROUP_LIMIT = 64
"""Runs per group-commit transaction of :meth:`SqlStore.finish_run` at most."""


@dataclass(frozen=True, slots=True)
class _Finish:
    """One :meth:`SqlStore.finish_run` call, queued for a shared transaction."""

    ending: RunEnding
    sessions_set: int
    """:attr:`SqlStore._sessions_set` when the call was made: a later ``set_session`` wins."""


def requeue(s: Session, run_id: RunId) -> list[Message]:
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
    return [to_message(r) for r in sorted(rows, key=lambda r: r.id)]


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


def _spend_values(ending: RunEnding, room: RoomKey) -> dict[str, Any]:
    """The run's row of the budget ledger: by room (a thread's cost is its room's)."""
    return {
        "run_id": ending.run_id,
        "transport": room.transport,
        "room_id": room.room_id,
        "at": ending.at,
        "cost_usd": ending.report.cost_usd,
    }


_END_RUN = update(RUNS).where(RUNS.c.seq == bindparam("b_seq"))
"""A run's outcome by primary key: the SET clause is the other keys of
:func:`_ended_run_values`."""


def _ended_run_values(seq: int, ending: RunEnding) -> dict[str, Any]:
    """A run's outcome, for :data:`_END_RUN`."""
    report = kept_report(ending.report)
    return {
        "b_seq": seq,
        "status": report.status.value,
        "ended_at": ending.at,
        "exit_code": report.exit_code,
        "session_id": report.session_id,
        "cost_usd": report.cost_usd,
        "num_turns": report.num_turns,
        "duration_ms": report.duration_ms,
        "session_not_found": report.session_not_found,
        "result_excerpt": report.result_text,
        "error_excerpt": report.error,
    }


def _dispatch_into(
    s: Session, run_id: RunId, batch: Batch, at: float, *, first: int, detail: str = ""
) -> list[dict[str, Any]]:
    """Mark the batch's messages dispatched into the run, at positions from ``first``;
    their audit rows (``message_dispatched``), for the caller to insert with its own."""
    ids = list(batch.ids)
    found = s.execute(
        update(MESSAGES)
        .where(MESSAGES.c.id.in_(ids))
        .values(state=MessageState.DISPATCHED.value, run_id=run_id)
    )
    if rowcount(found) != len(set(ids)):
        raise StoreError(f"run {run_id}: some of messages {ids} do not exist")
    s.execute(
        insert_statement(RUN_MESSAGES),
        [
            {"run_id": run_id, "message_id": message_id, "position": first + i}
            for i, message_id in enumerate(ids)
        ],
    )
    return [
        audit_values(audit_entries.dispatched(run_id, batch.room, MessageId(m), at, detail))
        for m in ids
    ]


class RunsSql(SqlBase):
    """Runs: started, steered into, finished, looked up, offered again."""

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self._finishes: GroupCommit[_Finish, list[OutboxEntry]] = GroupCommit(
            self._finish_group, limit=FINISH_GROUP_LIMIT
        )

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
                insert_statement(RUNS).values(
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
            audit.append(audit_values(audit_entries.run_started(run_id, room, len(ids), at)))
            s.execute(insert_statement(AUDIT), audit)

        await self._write(body, synced=self._server_may_restart)

    async def steer_into_run(self, run_id: RunId, batch: Batch, at: float) -> None:
        """Add messages sent into a running run's session to that run (see the protocol).

        Synced as :meth:`start_run` is (on SQLite not, on PostgreSQL yes)."""

        def body(s: Session) -> None:
            running = s.execute(
                update(RUNS)
                .where(RUNS.c.id == run_id, RUNS.c.status == RunStatus.RUNNING.value)
                .values(status=RunStatus.RUNNING.value)
            )
            if rowcount(running) != 1:
                raise StoreError(f"run {run_id} is not running")
            last = s.scalar(
                select(func.max(RUN_MESSAGES.c.position)).where(RUN_MESSAGES.c.run_id == run_id)
            )
            first = 0 if last is None else int(last) + 1
            audit = _dispatch_into(s, run_id, batch, at, first=first, detail=STEERED)
            s.execute(insert_statement(AUDIT), audit)

        await self._write(body, synced=self._server_may_restart)

    async def finish_run(self, ending: RunEnding) -> list[OutboxEntry]:
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
        return await self._finishes.submit(_Finish(ending, self._sessions_set))

    async def _finish_group(
        self, group: Sequence[_Finish], committing: Committing
    ) -> list[list[OutboxEntry] | Failed]:
        """Record the ends of ``group``, in order, in one transaction."""
        endings = [finish.ending for finish in group]
        if not any(e.keep_session and e.report.session_id is not None for e in endings):
            return await isolating(group, self._finish_together, committing)
        # Which sessions are kept is decided in the transaction (see
        # _finish_together); no set_session may commit between that and the
        # group's commit, or its value would be overwritten by an older one.
        async with self._session_writes:
            return await isolating(group, self._finish_together, committing)

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
                select(RUNS.c.seq, RUNS.c.id, RUNS.c.transport, RUNS.c.room_id, RUNS.c.status)
                .where(RUNS.c.id.in_({finish.ending.run_id for finish in group}))
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
                ending = finish.ending
                run_id, run = ending.run_id, runs.get(ending.run_id)
                if run is None:
                    placed.append(Failed(StoreError(f"no run {run_id}")))
                elif run_id in ended:
                    placed.append(ended[run_id])
                elif run.status != RunStatus.RUNNING.value:
                    placed.append(self._pending_entries(s, run_id))
                else:
                    room = _room(run.transport, run.room_id)
                    run_values.append(_ended_run_values(run.seq, ending))
                    # A run that never began: its messages wait to run, as if it never was.
                    settle.setdefault(settled_state(ending), []).append(run_id)
                    audit.append(audit_values(audit_entries.run_finished(ending, room)))
                    if ending.report.cost_usd is not None:
                        spend.append(_spend_values(ending, room))
                    kept = self._kept_session(finish, room)
                    if kept is not None:
                        sessions[room] = kept
                    first = len(outbox)
                    outbox += [outbox_values(r, ending.at, run_id) for r in ending.replies]
                    ended[run_id] = (first, len(outbox))
                    placed.append(ended[run_id])
            if run_values:
                # One executemany by primary key (Core: the ORM's bulk UPDATE cost more).
                s.execute(_END_RUN, run_values)
                # After the runs' UPDATE, which waits for a concurrent
                # register_live_run's lock: this then sees its row.
                s.execute(delete(LIVE_RUNS).where(LIVE_RUNS.c.run_id.in_(list(ended))))
            for state, run_ids in settle.items():
                s.execute(
                    update(MESSAGES)
                    .where(
                        MESSAGES.c.run_id.in_(run_ids),
                        MESSAGES.c.state == MessageState.DISPATCHED.value,
                    )
                    .values(state=state.value)
                )
            if sessions:
                # The session in the same transaction: one disk sync for the end of a run.
                s.execute(self._sessions_upsert, session_rows(sessions))
            if audit:
                s.execute(insert_statement(AUDIT), audit)
            if spend:
                s.execute(insert_statement(SPEND), spend)
            ids: list[int] = []
            if outbox:
                # One multi-row INSERT; its ids come back in the rows' order.
                returning = insert_statement(OUTBOX).returning(
                    OUTBOX.c.id, sort_by_parameter_order=True
                )
                ids = [new_id for (new_id,) in s.execute(returning, outbox)]
            entries = [new_entry(v, new_id) for v, new_id in zip(outbox, ids, strict=True)]
            return [entries[p[0] : p[1]] if isinstance(p, tuple) else p for p in placed]

        return await self._write(body, committing=committing)

    def _kept_session(self, finish: _Finish, room: RoomKey) -> SessionId | None:
        """The run's session, to become the room's: asked for, and not set anew since the call."""
        ending = finish.ending
        if not ending.keep_session or self._session_set_at.get(room, 0) > finish.sessions_set:
            return None
        return ending.report.session_id

    def _pending_entries(self, s: Session, run_id: RunId) -> list[OutboxEntry]:
        rows = s.scalars(
            select(OutboxRow)
            .where(
                OutboxRow.run_id == run_id,
                OutboxRow.state == DeliveryState.PENDING.value,
            )
            .order_by(OutboxRow.id)
        )
        return [to_outbox_entry(r) for r in rows]

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
            .where(*of_conversation(RunRow, room))
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
                and_(*of_conversation(RunRow, room), _offered()),
            )

        return await self._read(body)

    async def requeue_run(self, run_id: RunId) -> list[Message]:
        """Mark pending the messages that failed with this run as their last, while the
        run is offered (the rule of :meth:`retryable_runs`).

        One conditional UPDATE: of two concurrent retries of a run, one
        re-queues the messages and the other finds none.
        """
        return await self._write(lambda s: requeue(s, run_id))

    def _last_run(self, s: Session, room: RoomKey) -> RunRecord | None:
        last = s.scalar(select(func.max(RunRow.seq)).where(*of_conversation(RunRow, room)))
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
        return [to_run_record(r, tuple(members.get(r.id, ()))) for r in runs]

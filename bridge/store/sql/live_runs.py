"""The SQL store's :class:`~bridge.store.base.LiveRunStore`: the registry of live runs.

Registration is synced and ordered against the run's end by the run's row lock.
"""

from __future__ import annotations

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from bridge.core.model import LiveRun, RunId, RunStatus
from bridge.store.base import RegisteredRun, StoreError
from bridge.store.sql.rows import to_registered_run
from bridge.store.sql.shared import LIVE_RUNS, RUNS, SqlBase
from bridge.store.tables import LiveRunRow, RunRow


class LiveRunsSql(SqlBase):
    """The registry of live runs."""

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
                    update(RUNS)
                    .where(RUNS.c.id == live.run_id, RUNS.c.status == RunStatus.RUNNING.value)
                    .values(pid=live.claude_pid)
                    .returning(RUNS.c.transport, RUNS.c.room_id)
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
            upsert = self._insert(LIVE_RUNS).values(run_id=live.run_id, **whereabouts)
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
                    update(RUNS)
                    .where(RUNS.c.id == run_id, RUNS.c.status == RunStatus.RUNNING.value)
                    .values(pid=None)
                    .returning(RUNS.c.id)
                )
            ).one_or_none()
            if running is not None:
                s.execute(delete(LIVE_RUNS).where(LIVE_RUNS.c.run_id == run_id))

        await self._write(body)

    async def live_runs(self) -> list[RegisteredRun]:
        """Every registered run, oldest registration first, then in start order."""

        query = (
            select(LiveRunRow)
            .join(RunRow, RunRow.id == LiveRunRow.run_id)
            # Start order breaks ties, not the run id: PostgreSQL would
            # order text by its collation, the memory store by code point.
            .order_by(LiveRunRow.registered_at, RunRow.seq)
        )
        return await self._read_rows(query, to_registered_run)

    async def set_delivered_offset(self, run_id: RunId, offset: int) -> None:
        """Raise the run's delivered offset; a run not in the registry is ignored.

        Committed without a disk sync (see the module's docstring).
        """

        def body(s: Session) -> None:
            s.execute(
                update(LIVE_RUNS)
                .where(LIVE_RUNS.c.run_id == run_id)
                .values(delivered_offset=self._larger(LIVE_RUNS.c.delivered_offset, offset))
            )

        await self._write(body, synced=False)

"""The SQL store's :class:`~bridge.store.base.LedgerStore`: spend and the retries waiting for a
usage limit to reset (docs/budgets.md).
"""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from bridge.core.model import Message, RoomKey, RunId
from bridge.store.base import LimitResume
from bridge.store.keys import stored_id as _stored_id
from bridge.store.sql.rows import to_limit_resume
from bridge.store.sql.runs import requeue
from bridge.store.sql.shared import SqlBase, rowcount
from bridge.store.tables import LimitResumeRow, SpendRow


class LedgerSql(SqlBase):
    """The spend ledger and the retries waiting for a limit."""

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

        query = select(LimitResumeRow).order_by(LimitResumeRow.resets_at, LimitResumeRow.run_id)
        return await self._read_rows(query, to_limit_resume)

    async def drop_limit_resume(self, run_id: RunId) -> bool:
        """Forget the waiting retry of ``run_id``; whether there was one."""

        def body(s: Session) -> bool:
            result = s.execute(delete(LimitResumeRow).where(LimitResumeRow.run_id == run_id))
            return rowcount(result) > 0

        return await self._write(body)

    async def requeue_limit_resume(self, run_id: RunId) -> list[Message] | None:
        """Forget the waiting retry and re-queue its run's messages, in one transaction
        (the delete's row lock orders it against a concurrent call-off); None if none
        waited."""

        def body(s: Session) -> list[Message] | None:
            result = s.execute(delete(LimitResumeRow).where(LimitResumeRow.run_id == run_id))
            if rowcount(result) == 0:
                return None
            return requeue(s, run_id)

        return await self._write(body)

"""The SQL store's :class:`~bridge.store.base.ScheduleStore` and the transports'
:class:`~bridge.core.transport.SeenMarks`: marks that never go back, whichever replica writes.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from bridge.core.model import ExternalMessageId, RoomKey, TransportName
from bridge.store.keys import room_key as _room
from bridge.store.keys import stored_id as _stored_id
from bridge.store.sql.shared import SqlBase
from bridge.store.tables import ScheduleMarkRow, SeenMarkRow


class MarksSql(SqlBase):
    """Schedules' firing marks and transports' seen marks."""

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

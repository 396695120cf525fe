"""The SQL store's :class:`~bridge.store.base.OutboxStore`: replies kept for durable delivery.

Delivery records of concurrent deliveries share transactions (group commit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from bridge.core.model import Reply, RoomKey, RunId
from bridge.store.base import DeliveryState, OutboxEntry, StoreError
from bridge.store.batching import Committing, Failed, GroupCommit
from bridge.store.sql.rows import outbox_row, to_outbox_entry
from bridge.store.sql.shared import SqlBase, isolating, pending_rows, rowcount
from bridge.store.tables import OutboxRow

ENTRY_GROUP_LIMIT = 256
"""Outbox entries' delivery records per group-commit transaction at most."""


@dataclass(frozen=True, slots=True)
class _EntryUpdate:
    """One delivery record of an outbox entry, queued for a shared transaction."""

    entry_id: int
    values: dict[str, Any]


class OutboxSql(SqlBase):
    """The outbox: replies recorded for durable delivery."""

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        # Each delivered answer writes two records (its part, its end), synced:
        # with many answers going out at once they would queue one by one in
        # front of the next runs' ends.
        self._entry_updates: GroupCommit[_EntryUpdate, None] = GroupCommit(
            self._update_entries, limit=ENTRY_GROUP_LIMIT
        )

    def _enqueue(
        self, s: Session, replies: Sequence[Reply], at: float, run_id: RunId | None
    ) -> list[OutboxEntry]:
        rows = [outbox_row(reply, at, run_id) for reply in replies]
        s.add_all(rows)
        if rows:
            s.flush()  # assigns the ids, in order
        return [to_outbox_entry(row) for row in rows]

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
            row = outbox_row(reply, at, None)
            row.key = key
            s.add(row)
            s.flush()
            return [to_outbox_entry(row)]

        return await self._write(body)

    async def undelivered(self, room: RoomKey | None = None) -> list[OutboxEntry]:
        """Every pending outbox entry (or ``room``'s), in recording order."""
        query = pending_rows(OutboxRow, room)
        return await self._read_rows(query, to_outbox_entry)

    async def _update_entry(self, entry_id: int, **values: Any) -> None:
        """Update one outbox entry; concurrent calls share a transaction (group
        commit), an unknown entry fails only its own call."""
        if self._closed:
            raise StoreError("the store is closed")
        await self._entry_updates.submit(_EntryUpdate(entry_id, values))

    async def _update_entries(
        self, group: Sequence[_EntryUpdate], committing: Committing
    ) -> list[Failed | None]:
        return await isolating(group, self._update_entries_together, committing)

    async def _update_entries_together(
        self, group: Sequence[_EntryUpdate], committing: Committing
    ) -> list[Failed | None]:
        def body(s: Session) -> list[Failed | None]:
            outcomes: list[Failed | None] = []
            for entry in group:
                result = s.execute(
                    update(OutboxRow).where(OutboxRow.id == entry.entry_id).values(**entry.values)
                )
                missing = rowcount(result) == 0
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

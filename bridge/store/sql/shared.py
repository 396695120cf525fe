"""The SQL store's shared parts: its transactions, the tables as Core, the queries every role uses.

:class:`SqlBase` holds the engine and runs each body in one read or write transaction
(:mod:`bridge.store.transactions`); the role mixins of :mod:`bridge.store.sql` build on it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, Table, func, or_, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Mapped, Session

from bridge.core.model import MessageState, RoomKey
from bridge.store.base import ApprovalState, DeliveryState, StoreError
from bridge.store.batching import Committing, Failed
from bridge.store.engine import is_sqlite_file
from bridge.store.keys import THREAD_SEPARATOR, stored_id
from bridge.store.rules import LIVE_STATES
from bridge.store.tables import (
    ApprovalRow,
    AuditRow,
    Base,
    LiveRunRow,
    MessageRow,
    OutboxRow,
    RoomRow,
    RunMessageRow,
    RunRow,
    SpendRow,
)
from bridge.store.transactions import Body, InThreads, OnDriver, Transactions

LIVE = tuple(str(s) for s in LIVE_STATES)


# Core tables for executemany: plain rows, no ORM unit of work per message.
MESSAGES: Table = MessageRow.__table__  # type: ignore[assignment]


AUDIT: Table = AuditRow.__table__  # type: ignore[assignment]


RUNS: Table = RunRow.__table__  # type: ignore[assignment]


RUN_MESSAGES: Table = RunMessageRow.__table__  # type: ignore[assignment]


OUTBOX: Table = OutboxRow.__table__  # type: ignore[assignment]


LIVE_RUNS: Table = LiveRunRow.__table__  # type: ignore[assignment]


SPEND: Table = SpendRow.__table__  # type: ignore[assignment]


MAX_NUMBER = 2**31 - 1
"""The largest approval number an ``Integer`` column holds on every backend."""


ItemT = TypeVar("ItemT")


ResultT = TypeVar("ResultT")


async def isolating(
    group: Sequence[ItemT],
    together: Callable[[Sequence[ItemT], Committing], Awaitable[Sequence[ResultT | Failed]]],
    committing: Committing,
) -> list[ResultT | Failed]:
    """Write ``group`` in one transaction through ``together``.

    If the database refuses the group's data (not a lost connection or a
    lock), each item goes again alone, so that an item it refuses fails
    only its own caller, as without group commit.
    """
    try:
        return list(await together(group, committing))
    except StoreError as exc:
        if len(group) == 1 or not refused_data(exc):
            raise
    # Commits follow: from here on the leader must not cut this short.
    committing()
    outcomes: list[ResultT | Failed] = []
    for item in group:
        try:
            outcomes += await together([item], committing)
        except StoreError as exc:
            outcomes.append(Failed(exc))
    return outcomes


def refused_data(error: StoreError) -> bool:
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


def rowcount(result: Any) -> int:
    # Result of an UPDATE/DELETE; typed loosely in SQLAlchemy's stubs.
    count: int = result.rowcount
    return count


def in_room(column: Mapped[str], room: RoomKey) -> ColumnElement[bool]:
    """``column`` is ``room``'s room or one of its thread conversations: what a
    transport names by the room and a message id (an edit, a click) is found in
    whichever conversation holds it."""
    prefix = room.room_id + THREAD_SEPARATOR
    # A comparison, not LIKE: SQLite's LIKE ignores case, and room ids are
    # case-sensitive (Matrix's); nothing in them is read as a pattern either.
    return or_(column == room.room_id, func.substr(column, 1, len(prefix)) == prefix)


def of_conversation(row: type[Any], room: RoomKey) -> tuple[ColumnElement[bool], ...]:
    """The conditions picking ``row``'s rows of exactly the conversation ``room`` (a
    table with ``transport`` and ``room_id`` columns)."""
    conditions: tuple[ColumnElement[bool], ...] = (
        row.transport == room.transport,
        row.room_id == stored_id(room),
    )
    return conditions


_RowT = TypeVar("_RowT")
_RecordT = TypeVar("_RecordT")
_PendingRowT = TypeVar("_PendingRowT", MessageRow, OutboxRow, ApprovalRow)

_PENDING: dict[type[Base], str] = {
    MessageRow: MessageState.PENDING.value,
    OutboxRow: DeliveryState.PENDING.value,
    ApprovalRow: ApprovalState.PENDING.value,
}


def pending_rows(row: type[_PendingRowT], room: RoomKey | None) -> Select[_PendingRowT]:
    """The pending rows of messages, outbox entries or approvals, of every conversation
    or of exactly ``room``, oldest first (recovery, a room's queue, the desk)."""
    query = select(row).where(row.state == _PENDING[row])
    if room is not None:
        query = query.where(*of_conversation(row, room))
    return query.order_by(row.id)


class SqlBase:
    """The engine, the transactions and the state the roles share (each role is a mixin)."""

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

    async def _write(
        self,
        body: Body[ResultT],
        *,
        synced: bool = True,
        committing: Callable[[], None] | None = None,
    ) -> ResultT:
        """``body`` in one write transaction, committed (with a disk sync unless
        ``synced`` is false); errors become StoreError. See
        :mod:`bridge.store.transactions`, also for ``committing``."""
        if self._closed:
            # Disposing alone would let the pool quietly reconnect.
            raise StoreError("the store is closed")
        return await self._tx.write(body, synced=synced, committing=committing)

    async def _read(self, body: Body[ResultT]) -> ResultT:
        """``body`` in a read-only transaction on a reader connection: takes no write lock.

        It sees what was committed when it began; every write of this store
        has committed before its method returned, so a caller reads its own
        writes.
        """
        if self._closed:
            raise StoreError("the store is closed")
        return await self._tx.read(body)

    async def _read_rows(
        self, query: Select[_RowT], to: Callable[[_RowT], _RecordT]
    ) -> list[_RecordT]:
        """Every row ``query`` selects, as the records ``to`` makes of them, in its order."""

        def body(s: Session) -> list[_RecordT]:
            return [to(row) for row in s.scalars(query)]

        return await self._read(body)

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

    @functools.cached_property
    def _sessions_upsert(self) -> Any:
        """Setting rooms' sessions (``set_session``, and the runs a group ends), for an
        executemany of :func:`session_rows`: built and compiled once (a multi-row
        VALUES is compiled anew for each number of rows)."""
        upsert = self._insert(RoomRow)
        return upsert.on_conflict_do_update(
            index_elements=["transport", "room_id"],
            set_={"session_id": upsert.excluded.session_id},
        )

"""Another connection holding a SQL database's write lock, as another process could."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy import event
from sqlalchemy.engine import make_url

from bridge.store.engine import is_sqlite
from bridge.store.sql import SqlStore


class WriteLock:
    """Another connection holding the write lock, as another process could."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._sqlite: sqlite3.Connection | None = None
        self._postgres: Any = None

    async def acquire(self) -> None:
        if is_sqlite(self._url):
            self._sqlite = sqlite3.connect(str(make_url(self._url).database), isolation_level=None)
            self._sqlite.execute("BEGIN IMMEDIATE")
        else:
            dsn = make_url(self._url).set(drivername="postgresql")
            self._postgres = await asyncpg.connect(dsn.render_as_string(hide_password=False))
            await self._postgres.execute("BEGIN")
            await self._postgres.execute("LOCK TABLE messages IN EXCLUSIVE MODE")

    async def release(self) -> None:
        if self._sqlite is not None:
            self._sqlite.execute("ROLLBACK")
            self._sqlite.close()
            self._sqlite = None
        if self._postgres is not None:
            await self._postgres.execute("ROLLBACK")
            await self._postgres.close()
            self._postgres = None


@asynccontextmanager
async def write_lock(url: str) -> AsyncIterator[WriteLock]:
    """Hold the write lock until ``release()`` or the end of the block."""
    lock = WriteLock(url)
    await lock.acquire()
    try:
        yield lock
    finally:
        await lock.release()


def write_begins(store: SqlStore, url: str, postgres_stops_at: str) -> asyncio.Event:
    """Set once ``store``'s next write reaches the statement a held write lock stops.

    SQLite waits at ``BEGIN IMMEDIATE``; PostgreSQL at the first statement
    that touches a locked row or table (``postgres_stops_at``, its start).
    """
    begun = asyncio.Event()
    blocking = "BEGIN IMMEDIATE" if is_sqlite(url) else postgres_stops_at
    loop = asyncio.get_running_loop()

    # On a SQLite file the hook runs in the store's writer thread.
    @event.listens_for(store.writes_on, "before_cursor_execute")
    def _statement(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if statement.startswith(blocking):
            loop.call_soon_threadsafe(begun.set)

    return begun

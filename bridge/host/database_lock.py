"""One chatbridge per database, unless they are replicas.

A start takes a lock for the service's life: on SQLite an exclusive ``flock`` on
``<file>.lock``; on PostgreSQL a session-level advisory lock on a connection held open,
exclusive for a lone chatbridge and shared for replicas, so each refuses the other
(docs/replicas.md, the introduction).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bridge.errors import StartupError
from bridge.host.state_lock import LockHeld, pid_lock

ADVISORY_KEY = 0x63686174627267
"""The advisory lock's key ("chatbrg"): the same for every chatbridge on a database."""


@contextlib.asynccontextmanager
async def database_lock(engine: AsyncEngine, *, shared: bool) -> AsyncIterator[None]:
    """Hold the lock of ``engine``'s database for the block; :class:`StartupError` if
    another chatbridge holds it. An in-memory SQLite database needs none."""
    parsed = engine.url
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            yield
            return
        with _file_lock(Path(parsed.database or "")):
            yield
        return
    async with _advisory_lock(engine, shared=shared):
        yield


@contextlib.contextmanager
def _file_lock(database: Path) -> Iterator[None]:
    with contextlib.ExitStack() as held_for_the_block:
        try:
            held_for_the_block.enter_context(pid_lock(database.with_name(database.name + ".lock")))
        except LockHeld as held:
            raise StartupError(
                f"database.url: {database} is in use by another chatbridge (pid {held.holder});"
                " a SQLite database serves one chatbridge (replicas need PostgreSQL)"
            ) from None
        except OSError as exc:
            raise StartupError(f"database.url: cannot lock {database}: {exc.strerror}") from exc
        yield


@contextlib.asynccontextmanager
async def _advisory_lock(engine: AsyncEngine, *, shared: bool) -> AsyncIterator[None]:
    function = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
    async with engine.connect() as conn:
        got = await conn.scalar(text(f"SELECT {function}(:k)"), {"k": ADVISORY_KEY})
        await conn.commit()
        if not got:
            if shared:
                why = (
                    "a chatbridge that is not a replica uses it; stop it, or enable [cluster] there"
                )
            else:
                why = (
                    "another chatbridge uses it; give each its own database,"
                    " or enable [cluster] on all of them to run them as replicas"
                )
            raise StartupError(f"database.url: {why}")
        try:
            yield
        finally:
            # The connection goes back to the pool, not away: the lock would stay.
            with contextlib.suppress(Exception):
                unlock = "pg_advisory_unlock_shared" if shared else "pg_advisory_unlock"
                await conn.execute(text(f"SELECT {unlock}(:k)"), {"k": ADVISORY_KEY})
                await conn.commit()

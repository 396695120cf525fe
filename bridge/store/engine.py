"""Creating the async engine: the one place that knows backend quirks.

SQLite connections get WAL (readers do not block the writer), a busy timeout
(a second writer waits instead of failing at once), foreign keys (off by
default in SQLite) and ``BEGIN IMMEDIATE``: a deferred transaction that reads
before it writes can fail with "database is locked" without waiting, an
immediate one takes the write lock up front and so honours the timeout.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

DEFAULT_URL = "sqlite+aiosqlite:///chatbridge.db"
SQLITE_BUSY_TIMEOUT_MS = 5000


def is_sqlite(url: str) -> bool:
    """Whether ``url`` names a SQLite database."""
    return make_url(url).get_backend_name() == "sqlite"


MASK = "***"

_SAFE_QUERY_KEYS = frozenset(
    {"sslmode", "charset", "timeout", "connect_timeout", "application_name", "driver", "mode"}
)
"""Query parameters known to carry no secret; every other value is masked
(``password``, ``sslpassword``, ``sslkey`` contents, tokens of any driver)."""


def redacted(url: str) -> str:
    """``url`` with its password hidden, for messages and logs.

    Hides the user part's password and the value of every query parameter
    not known to be harmless: drivers accept passwords there too
    (``?password=``, ``?sslpassword=``). An unparsable URL is hidden whole.
    """
    try:
        parsed = make_url(url)
        query = {
            key: value if key.lower() in _SAFE_QUERY_KEYS else MASK
            for key, value in parsed.query.items()
        }
        return parsed.set(query=query).render_as_string(hide_password=True)
    except Exception:  # any parse failure: never echo what we cannot read
        return MASK


def create_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for ``url``, with the SQLite settings above applied."""
    if is_sqlite(url) and make_url(url).database not in (None, "", ":memory:"):
        # One connection per file and process: SQLite admits one writer at a
        # time anyway, and queueing for the pooled connection wakes the next
        # task as soon as a commit ends, whereas contending connections would
        # wait in SQLite's busy handler, which polls with sleeps. (In-memory
        # databases keep SQLAlchemy's single static connection.)
        kwargs = {"pool_size": 1, "max_overflow": 0, **kwargs}
    # Statement parameters are message texts and run excerpts: keep them out of
    # error messages, which reach the logs.
    engine = create_async_engine(url, hide_parameters=True, **kwargs)
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        # The driver must not open transactions itself; "begin" below does.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
            # FULL (not WAL's usual NORMAL): a transport acknowledges a message
            # upstream once accept() returns, so a commit must survive an OS
            # crash, not only a process crash.
            cursor.execute("PRAGMA synchronous=FULL")
        finally:
            cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

"""Creating the async engine: the one place that knows backend quirks.

:func:`create_engine` (the writer), :func:`create_reader` (read-only transactions never
queued behind a write), :func:`configure_sqlite` (WAL, busy timeout, foreign keys,
``BEGIN IMMEDIATE``) and :func:`without_sync` (commits that need not reach the disk)
(docs/operations.md, "How the store writes").
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

from bridge.core.private import sqlite_files

DEFAULT_URL = "sqlite+aiosqlite:///chatbridge.db"
SQLITE_BUSY_TIMEOUT_MS = 5000
SQLITE_READERS = 3
"""Reader connections per SQLite file: reads are short, and each is a thread."""

NO_SYNC = "chatbridge_no_sync"
"""Execution option: the transaction's commit need not be synced to disk."""

_SYNCHRONOUS = "chatbridge_synchronous"
"""Key in a SQLite connection's ``info``: its current ``PRAGMA synchronous``."""


def is_sqlite(url: str) -> bool:
    """Whether ``url`` names a SQLite database."""
    return make_url(url).get_backend_name() == "sqlite"


def is_sqlite_file(url: str | URL) -> bool:
    """Whether ``url`` names a SQLite database in a file (not in memory)."""
    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:")


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


def asyncpg_ssl(url: str) -> URL | str:
    """``url`` with libpq's ``sslmode`` renamed to asyncpg's ``ssl`` (same values).

    Operators copy PostgreSQL URLs from libpq tools; asyncpg would refuse
    ``sslmode`` as an unknown argument (a TypeError at connect).
    """
    parsed = make_url(url)
    mode = parsed.query.get("sslmode")
    if mode is None or parsed.get_backend_name() != "postgresql" or "ssl" in parsed.query:
        return url
    return parsed.difference_update_query(["sslmode"]).update_query_dict({"ssl": mode})


def create_engine(
    url: str, *, idle_transaction_timeout_s: float | None = None, **kwargs: Any
) -> AsyncEngine:
    """An async engine for ``url``, with the SQLite settings above applied.

    ``idle_transaction_timeout_s`` (PostgreSQL): the server ends a session
    whose transaction stays idle that long. Replicas set it: a replica
    paused mid-transaction (``SIGSTOP``, a frozen VM) would otherwise hold
    its row locks, and with them every other replica's takeover, for as long
    as it stays paused.
    """
    if is_sqlite_file(url):
        # One connection per file and process: SQLite admits one writer at a
        # time anyway, and queueing for the pooled connection wakes the next
        # task as soon as a commit ends, whereas contending connections would
        # wait in SQLite's busy handler, which polls with sleeps. (In-memory
        # databases keep SQLAlchemy's single static connection.)
        kwargs = {"pool_size": 1, "max_overflow": 0, **kwargs}
    # Statement parameters are message texts and run excerpts: keep them out of
    # error messages, which reach the logs.
    if idle_transaction_timeout_s is not None and not is_sqlite(url):
        ms = str(round(idle_transaction_timeout_s * 1000))
        kwargs["connect_args"] = {
            **kwargs.get("connect_args", {}),
            "server_settings": {"idle_in_transaction_session_timeout": ms},
        }
    engine = create_async_engine(asyncpg_ssl(url), hide_parameters=True, **kwargs)
    if engine.dialect.name == "sqlite":
        configure_sqlite(engine.sync_engine, reader=False)
    else:

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Connection) -> None:
            if conn.get_execution_options().get(NO_SYNC):
                # LOCAL: for this transaction only; the next commits sync again.
                conn.exec_driver_sql("SET LOCAL synchronous_commit = off")

    return engine


def without_sync(writer: AsyncEngine) -> AsyncEngine:
    """``writer`` (same connections) for transactions whose commit is not synced."""
    return writer.execution_options(**{NO_SYNC: True})


def create_reader(writer: AsyncEngine) -> AsyncEngine:
    """An engine for read-only transactions beside ``writer``.

    ``writer`` itself for an in-memory SQLite database: no other connection
    can see it. The caller disposes a reader that is not ``writer``'s pool
    (:func:`shares_pool`).
    """
    if writer.dialect.name != "sqlite":
        # Its own connection from the pool; READ ONLY comes with BEGIN (no
        # extra round trip) and refuses any write by mistake.
        return writer.execution_options(postgresql_readonly=True)
    if writer.url.database in (None, "", ":memory:"):
        return writer
    reader = create_async_engine(
        writer.url, hide_parameters=True, pool_size=SQLITE_READERS, max_overflow=0
    )
    configure_sqlite(reader.sync_engine, reader=True)
    return reader


def shares_pool(a: AsyncEngine, b: AsyncEngine) -> bool:
    """Whether two engines draw on the same connections (dispose only one)."""
    return a.sync_engine.pool is b.sync_engine.pool


def configure_sqlite(engine: Engine, *, reader: bool) -> None:
    """The SQLite settings above, on every connection of ``engine`` (either driver).

    A database in a file is made private first (0600, its ``-wal`` and ``-shm``
    too): it holds every prompt and answer (docs/operations.md)."""
    if is_sqlite_file(engine.url) and not reader:
        database = engine.url.database
        if database is not None and not database.startswith("file:"):
            sqlite_files(database)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        # The driver must not open transactions itself; "begin" below does.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
            # FULL (not WAL's usual NORMAL): a transport acknowledges a message
            # upstream once accept() returns, so a commit must survive an OS
            # crash, not only a process crash. Transactions that need less
            # say so (NO_SYNC, below).
            cursor.execute("PRAGMA synchronous=FULL")
            record.info[_SYNCHRONOUS] = "FULL"
            if reader:
                cursor.execute("PRAGMA query_only=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if reader:
            # Deferred: takes no write lock, reads the last committed snapshot.
            conn.exec_driver_sql("BEGIN")
            return
        # Each transaction states the level its commit needs, before BEGIN so
        # that it governs this transaction's commit; the pragma is sent only
        # when the level changes (one round trip to the driver's thread).
        level = "NORMAL" if conn.get_execution_options().get(NO_SYNC) else "FULL"
        if conn.info.get(_SYNCHRONOUS) != level:
            conn.exec_driver_sql(f"PRAGMA synchronous={level}")
            conn.info[_SYNCHRONOUS] = level
        conn.exec_driver_sql("BEGIN IMMEDIATE")

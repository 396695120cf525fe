"""Running the store's transactions: each is a plain function of a session.

:class:`~bridge.store.sql.SqlStore` writes every transaction as a *body*, a synchronous
function of a SQLAlchemy ``Session``, run in one transaction committed when it returns:
:class:`InThreads` (a SQLite file: a writer thread and reader threads) or :class:`OnDriver`
(PostgreSQL, in-memory SQLite). A caller cancelled before the commit began writes nothing
(docs/operations.md, "How the store writes").
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Protocol, TypeVar

from sqlalchemy import Engine, event
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from bridge.store.base import StoreError
from bridge.store.batching import settle
from bridge.store.engine import (
    NO_SYNC,
    SQLITE_READERS,
    configure_sqlite,
    create_reader,
    shares_pool,
    without_sync,
)

T = TypeVar("T")

Body = Callable[[Session], T]
"""A transaction's work, on a session whose transaction is already begun."""


class Transactions(Protocol):
    """Runs bodies in transactions (see the module's docstring)."""

    async def write(
        self, body: Body[T], *, synced: bool = True, committing: Callable[[], None] | None = None
    ) -> T:
        """Run ``body`` in a write transaction and commit it.

        ``synced=False``: the commit need not reach the disk (see
        :func:`bridge.store.engine.without_sync`). ``committing`` is called
        right before the commit, from whichever thread commits.
        """
        ...

    async def read(self, body: Body[T]) -> T:
        """Run ``body`` in a read-only transaction that takes no write lock."""
        ...

    @property
    def engine(self) -> Engine:
        """The engine whose events see every write transaction."""
        ...

    async def close(self) -> None:
        """Release what the runner made (connections, threads); transactions in
        flight end first. The caller disposes the engine it gave."""
        ...


@contextlib.contextmanager
def store_errors() -> Iterator[None]:
    """Turn a database's or driver's error into :class:`StoreError`."""
    try:
        yield
    except (SQLAlchemyError, OSError) as exc:  # OSError: a lost socket or file
        raise StoreError(str(exc)) from exc
    except UnicodeError as exc:
        # The driver could not encode a text (a lone surrogate): the data
        # was refused, like any other, and must not escape as a crash.
        raise StoreError(f"text the database cannot store: {exc}") from exc


class OnDriver:
    """Bodies on the asyncio driver of ``writer`` (and its readers)."""

    def __init__(self, writer: AsyncEngine) -> None:
        self._writer = writer
        self._readers = create_reader(writer)
        self._synced = async_sessionmaker(writer, expire_on_commit=False)
        self._unsynced = async_sessionmaker(without_sync(writer), expire_on_commit=False)
        self._reads = async_sessionmaker(self._readers, expire_on_commit=False)

    @property
    def engine(self) -> Engine:
        """The engine whose events see every write transaction."""
        return self._writer.sync_engine

    async def write(
        self, body: Body[T], *, synced: bool = True, committing: Callable[[], None] | None = None
    ) -> T:
        with store_errors():
            async with (self._synced if synced else self._unsynced).begin() as session:
                result = await session.run_sync(body)
                if committing is not None:
                    committing()
                return result

    async def read(self, body: Body[T]) -> T:
        with store_errors():
            async with self._reads.begin() as session:
                return await session.run_sync(body)

    async def close(self) -> None:
        if not shares_pool(self._readers, self._writer):
            await self._readers.dispose()


class InThreads:
    """Bodies in threads, on the standard library's driver, for the SQLite file at ``url``."""

    def __init__(self, url: str) -> None:
        # The same file through the synchronous driver; check_same_thread off
        # because a pooled connection may serve another thread of the pool
        # (each is used by one thread at a time).
        sync_url = _sync_sqlite_url(url)
        connect_args = {"check_same_thread": False}
        self._writer = create_sync_engine(
            sync_url,
            hide_parameters=True,
            pool_size=1,
            max_overflow=0,
            connect_args=connect_args,
        )
        configure_sqlite(self._writer, reader=False)
        event.listen(self._writer, "before_cursor_execute", _stop_if_cancelled)
        self._readers = create_sync_engine(
            sync_url,
            hide_parameters=True,
            pool_size=SQLITE_READERS,
            max_overflow=0,
            connect_args=connect_args,
        )
        configure_sqlite(self._readers, reader=True)
        event.listen(self._readers, "before_cursor_execute", _stop_if_cancelled)
        self._synced = sessionmaker(self._writer, expire_on_commit=False)
        self._unsynced = sessionmaker(
            self._writer.execution_options(**{NO_SYNC: True}), expire_on_commit=False
        )
        self._reads = sessionmaker(self._readers, expire_on_commit=False)
        self._writing = ThreadPoolExecutor(1, thread_name_prefix="chatbridge-store-writer")
        self._reading = ThreadPoolExecutor(
            SQLITE_READERS, thread_name_prefix="chatbridge-store-reader"
        )

    @property
    def engine(self) -> Engine:
        """The engine whose events see every write transaction (in the writer thread)."""
        return self._writer

    async def write(
        self, body: Body[T], *, synced: bool = True, committing: Callable[[], None] | None = None
    ) -> T:
        attempt = _Attempt(committing)
        sessions = self._synced if synced else self._unsynced
        job = partial(_transact, sessions, body, attempt)
        return await _in_thread(self._writing, job, attempt, report=committing is not None)

    async def read(self, body: Body[T]) -> T:
        attempt = _Attempt(None)
        job = partial(_transact, self._reads, body, attempt)
        return await _in_thread(self._reading, job, attempt, report=False)

    async def close(self) -> None:
        # Off the loop: shutting down waits for the transactions in flight.
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self._writing.shutdown(wait=True)
        self._reading.shutdown(wait=True)
        self._writer.dispose()
        self._readers.dispose()


def _sync_sqlite_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="sqlite+pysqlite").render_as_string(hide_password=False)


class _RolledBack(Exception):
    """The caller was cancelled before the commit: the transaction was rolled back."""


class _Attempt:
    """Whether a transaction in a thread may still commit: its caller's cancel and
    the thread's commit decide under one lock, so exactly one of them wins."""

    __slots__ = ("_committing", "_lock", "cancelled", "committed")

    def __init__(self, committing: Callable[[], None] | None) -> None:
        self._lock = threading.Lock()
        self._committing = committing
        self.cancelled = False
        self.committed = False

    def cancel(self) -> bool:
        """Called on the loop: False if the commit has already begun."""
        with self._lock:
            if self.committed:
                return False
            self.cancelled = True
            return True

    def may_commit(self) -> bool:
        """Called in the thread right before the commit."""
        with self._lock:
            if self.cancelled:
                return False
            self.committed = True
            if self._committing is not None:
                self._committing()
            return True


_running = threading.local()
"""Per thread of a runner: the attempt of the transaction it runs (``attempt``)."""


def _transact(sessions: sessionmaker[Session], body: Body[T], attempt: _Attempt) -> T:
    """In a thread: ``body`` in a transaction, committed unless the caller gave up."""
    _running.attempt = attempt
    try:
        with sessions.begin() as session:
            result = body(session)
            if not attempt.may_commit():
                raise _RolledBack  # leaving the block rolls back
            return result
    finally:
        _running.attempt = None


def _stop_if_cancelled(*_args: object) -> None:
    """Before each statement in a runner's thread: a transaction whose caller gave up
    runs no further statement (it rolls back). Never once the commit has begun: a
    cancel then no longer counts (:meth:`_Attempt.cancel`)."""
    attempt: _Attempt | None = getattr(_running, "attempt", None)
    if attempt is not None and attempt.cancelled:
        raise _RolledBack


async def _in_thread(
    executor: ThreadPoolExecutor, job: Callable[[], T], attempt: _Attempt, *, report: bool
) -> T:
    """``job``'s result, from a thread of ``executor``; see the module's docstring
    for what a cancellation does (``report``: a group commit's transaction)."""
    future: Future[T] = executor.submit(job)
    waiting = asyncio.wrap_future(future)
    try:
        with store_errors():
            return await asyncio.shield(waiting)
    except asyncio.CancelledError:
        if future.cancel():
            raise  # never started
        if attempt.cancel():
            # It will roll back before its commit: nothing written.
            await _settled(waiting)
            raise
        # The commit had begun: wait for its outcome.
        await _settled(waiting)
        if not report:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        with store_errors():
            return waiting.result()


async def _settled(future: asyncio.Future[T]) -> None:
    """:func:`settle`, and its outcome retrieved: the caller has its answer already."""
    await settle(future)
    if not future.cancelled():
        future.exception()

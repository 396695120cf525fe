"""What only the SQL store has: opening, migrating, SQLite settings, durability."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.store.base import StoreError
from bridge.store.engine import SQLITE_BUSY_TIMEOUT_MS, create_engine, create_reader, redacted
from bridge.store.migrate import current_revision, downgrade, head_revision
from bridge.store.sql import SqlStore

ROOM = RoomKey(TransportName("console"), RoomId("local"))


def inbound(external_id: str) -> InboundMessage:
    return InboundMessage(ROOM, UserId("me"), "hi", ExternalMessageId(external_id))


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_open_migrates_by_default(empty_sql_url: str) -> None:
    store = await SqlStore.open(empty_sql_url)
    try:
        assert await current_revision(empty_sql_url) == head_revision()
        assert await store.accept(inbound("$1"), 1.0) is not None
    finally:
        await store.close()


async def test_open_without_migration_names_the_command(empty_sql_url: str) -> None:
    with pytest.raises(StoreError, match="run `chatbridge migrate`") as info:
        await SqlStore.open(empty_sql_url, auto_migrate=False)
    assert "revision none" in str(info.value)


async def test_open_after_downgrade_is_refused(empty_sql_url: str) -> None:
    await (await SqlStore.open(empty_sql_url)).close()
    await downgrade(empty_sql_url)
    with pytest.raises(StoreError, match="chatbridge migrate"):
        await SqlStore.open(empty_sql_url, auto_migrate=False)


async def test_data_survives_reopening(empty_sql_url: str) -> None:
    first = await SqlStore.open(empty_sql_url)
    try:
        accepted = await first.accept(inbound("$1"), 1.0)
    finally:
        await first.close()
    second = await SqlStore.open(empty_sql_url, auto_migrate=False)
    try:
        assert await second.pending_messages() == [accepted]
        assert await second.accept(inbound("$1"), 2.0) is None
    finally:
        await second.close()


async def test_two_stores_on_one_database_never_duplicate(empty_sql_url: str) -> None:
    """Two engines (as two processes would have) race on the same ids."""
    a = await SqlStore.open(empty_sql_url)
    b = await SqlStore.open(empty_sql_url, auto_migrate=False)
    try:
        results = await asyncio.gather(
            *(s.accept(inbound(f"$m{i}"), 1.0) for i in range(20) for s in (a, b))
        )
        assert len([r for r in results if r is not None]) == 20
        assert len(await a.pending_messages()) == 20
    finally:
        await a.close()
        await b.close()


async def test_sqlite_connection_settings(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    try:
        async with engine.connect() as conn:
            pragmas = {
                name: (await conn.execute(text(f"PRAGMA {name}"))).scalar_one()
                for name in ("journal_mode", "busy_timeout", "foreign_keys", "synchronous")
            }
    finally:
        await engine.dispose()
    # synchronous 2 is FULL.
    assert pragmas == {
        "journal_mode": "wal",
        "busy_timeout": SQLITE_BUSY_TIMEOUT_MS,
        "foreign_keys": 1,
        "synchronous": 2,
    }


@pytest.mark.parametrize("auto_migrate", [True, False])
async def test_unreachable_server_is_a_store_error(auto_migrate: bool) -> None:
    url = f"postgresql+asyncpg://postgres:secret@127.0.0.1:{closed_port()}/nothing"
    with pytest.raises(StoreError, match=r"127\.0\.0\.1") as info:
        await SqlStore.open(url, auto_migrate=auto_migrate)
    assert "secret" not in str(info.value)


def test_redacted_hides_the_password() -> None:
    assert redacted("postgresql+asyncpg://u:pw@h/db") == "postgresql+asyncpg://u:***@h/db"


async def test_accept_is_committed_when_it_returns(empty_sql_url: str) -> None:
    """Another connection sees the message at once: the transport may ack."""
    writer = await SqlStore.open(empty_sql_url)
    reader = await SqlStore.open(empty_sql_url, auto_migrate=False)
    try:
        accepted = await writer.accept(inbound("$1"), 1.0)
        assert await reader.pending_messages() == [accepted]
    finally:
        await writer.close()
        await reader.close()


async def test_cancelled_accept_leaves_nothing_behind(tmp_path: Path) -> None:
    """Cancellation propagates out of a blocked transaction, which rolls back."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'c.db'}"
    await (await SqlStore.open(url)).close()
    engine = create_engine(url)
    store = SqlStore(engine)
    beginning = asyncio.Event()
    loop = asyncio.get_running_loop()

    @event.listens_for(store.writes_on, "before_cursor_execute")
    def _seen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if statement == "BEGIN IMMEDIATE":  # in the store's writer thread
            loop.call_soon_threadsafe(beginning.set)

    # Another connection holds the write lock, so the store's BEGIN waits.
    blocker = sqlite3.connect(tmp_path / "c.db", isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        task = asyncio.create_task(store.accept(inbound("$1"), 1.0))
        await beginning.wait()
        task.cancel()
        # Two turns of the loop: the accept's leader takes its cancellation and cancels
        # its transaction, which tells the writer thread before the lock comes free.
        for _ in range(2):
            await asyncio.sleep(0)
        blocker.execute("ROLLBACK")
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        blocker.close()
    try:
        assert await store.pending_messages() == []
        assert await store.audit_trail() == []
        assert await store.accept(inbound("$1"), 2.0) is not None
    finally:
        await store.close()


async def test_sqlite_readers_cannot_write(tmp_path: Path) -> None:
    """Reader connections are query-only: a write sent there by mistake fails."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    await (await SqlStore.open(url)).close()
    writer = create_engine(url)
    reader = create_reader(writer)
    try:
        async with reader.connect() as conn:
            assert (await conn.execute(text("PRAGMA query_only"))).scalar_one() == 1
            with pytest.raises(OperationalError, match="readonly"):
                await conn.execute(text("DELETE FROM messages"))
    finally:
        await reader.dispose()
        await writer.dispose()


@pytest.fixture
def fresh_postgres_url(postgres_database: Callable[[str], str]) -> str:
    """Synchronous: the session fixture runs its own event loop."""
    return postgres_database("sslmode")


@pytest.mark.postgres
async def test_libpq_sslmode_in_the_url_reaches_postgresql(fresh_postgres_url: str) -> None:
    """``?sslmode=`` as libpq tools write it: asyncpg alone would refuse the argument."""
    url = fresh_postgres_url
    store = await SqlStore.open(f"{url}?sslmode=disable")
    try:
        assert await store.accept(inbound("$1"), 1.0) is not None
    finally:
        await store.close()
    # The mode reached asyncpg: the server either speaks TLS or says it does not.
    try:
        await (await SqlStore.open(f"{url}?sslmode=require")).close()
        outcome = "opened over TLS"
    except StoreError as exc:
        outcome = str(exc)
    assert outcome == "opened over TLS" or "SSL" in outcome, outcome

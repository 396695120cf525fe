"""Store errors reach the logs: they must not carry message texts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.store.base import StoreError
from bridge.store.sql import SqlStore
from tests.file_modes import mode


async def test_a_failed_write_does_not_quote_the_message(tmp_path: Path) -> None:
    store = await SqlStore.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    try:
        async with store._engine.begin() as conn:  # break the schema on purpose
            await conn.exec_driver_sql("ALTER TABLE messages RENAME TO messages_gone")
        room = RoomKey(TransportName("console"), RoomId("c"))
        message = InboundMessage(
            room, UserId("u"), "the db password is hunter2", ExternalMessageId("x")
        )
        with pytest.raises(StoreError) as info:
            await store.accept(message, 1.0)
    finally:
        await store.close()
    assert "messages" in str(info.value)
    assert "hunter2" not in str(info.value)


async def test_the_sqlite_database_and_its_wal_are_private_to_the_user(
    tmp_path: Path, umask: int
) -> None:
    db = tmp_path / "chatbridge.db"
    store = await SqlStore.open(f"sqlite+aiosqlite:///{db}")
    try:
        room = RoomKey(TransportName("console"), RoomId("c"))
        await store.accept(
            InboundMessage(room, UserId("u"), "the password", ExternalMessageId("x")), 1.0
        )
        files = [db, tmp_path / "chatbridge.db-wal", tmp_path / "chatbridge.db-shm"]
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
    finally:
        await store.close()


async def test_a_database_left_readable_by_an_earlier_version_is_made_private(
    tmp_path: Path, umask: int
) -> None:
    db = tmp_path / "chatbridge.db"
    store = await SqlStore.open(f"sqlite+aiosqlite:///{db}")
    await store.close()
    for path in tmp_path.iterdir():
        path.chmod(0o644)
    store = await SqlStore.open(f"sqlite+aiosqlite:///{db}")
    try:
        assert {p.name: mode(p) for p in tmp_path.iterdir()} == {
            p.name: 0o600 for p in tmp_path.iterdir()
        }
    finally:
        await store.close()


async def test_a_database_the_operator_placed_elsewhere_by_a_symlink_opens_and_is_private(
    tmp_path: Path, umask: int
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "chatbridge.db").symlink_to(data / "chatbridge.db")
    store = await SqlStore.open(f"sqlite+aiosqlite:///{tmp_path / 'chatbridge.db'}")
    try:
        room = RoomKey(TransportName("console"), RoomId("c"))
        await store.accept(
            InboundMessage(room, UserId("u"), "the password", ExternalMessageId("x")), 1.0
        )
    finally:
        await store.close()
    assert mode(data / "chatbridge.db") == 0o600

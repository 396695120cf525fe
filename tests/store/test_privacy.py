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

"""The service's sink records messages handed over together in the order of the calls.

The Matrix and Slack transports rely on it (see ``InboundSink``): they start a
burst's ``accept`` calls one after the other without awaiting each, and the
intake must queue each message in the store before its first wait, so the
store's group commit records them in call order and together.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from sqlalchemy import event

from bridge.config import load_settings
from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.transport import Accepted
from bridge.store.sql import SqlStore
from tests.bridge.harness import ConsoleSession, write_config

ROOM = RoomKey(TransportName("console"), RoomId("console"))


async def test_messages_accepted_together_are_recorded_in_call_order_in_one_transaction(
    tmp_path: Path,
) -> None:
    texts = [f"part {i}" for i in range(20)]
    async with ConsoleSession(load_settings(write_config(tmp_path))) as session:
        service = session.service
        assert service is not None
        store = service.store
        assert isinstance(store, SqlStore)
        inserts = 0

        @event.listens_for(store._engine.sync_engine, "before_cursor_execute")
        def _statement(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
            # One INSERT of the messages per transaction of accepts (other parts
            # of the service write too, so commits alone would not tell).
            nonlocal inserts
            inserts += statement.startswith("INSERT INTO messages")

        messages = [
            InboundMessage(ROOM, UserId("local"), text, ExternalMessageId(f"ext-{i}"))
            for i, text in enumerate(texts)
        ]
        results = await asyncio.gather(*(service.intake.accept(m) for m in messages))
        assert inserts == 1
        assert results == [Accepted.ACCEPTED] * len(texts)
        await session.finish()
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        rows = db.execute("select text from messages order by id").fetchall()
    assert [text for (text,) in rows] == texts

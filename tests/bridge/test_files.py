"""Files without text: answered by the core (after its authorization), never run."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from bridge.config import Settings, load_settings
from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.transport import Accepted
from bridge.intake import FILES_NOT_SUPPORTED
from bridge.service import open_store
from tests.bridge.chat_room import serving
from tests.bridge.harness import write_config


def db_rows(tmp_path: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        return db.execute(sql).fetchall()


def files_only(
    room: RoomKey,
    external_id: str,
    *,
    sender: str = "local",
    sender_is_bot: bool = False,
    mentions_bot: bool = False,
) -> InboundMessage:
    """A message of one file and no text, as a transport hands it over."""
    return InboundMessage(
        room,
        UserId(sender),
        "",
        ExternalMessageId(external_id),
        sender_is_bot=sender_is_bot,
        mentions_bot=mentions_bot,
        files=1,
    )


def console_room(settings: Settings) -> RoomKey:
    return RoomKey(TransportName("console"), RoomId(settings.console.room))


async def test_files_without_text_are_answered_and_never_run(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    async with serving(settings) as (service, chat):
        assert chat.sink is not None
        assert await chat.sink(files_only(chat.room, "f-1")) is Accepted.ACCEPTED
        await chat.wait_until(lambda: FILES_NOT_SUPPORTED in chat.texts(ReplyKind.NOTICE))
        # Not for a bot, nor for someone the room does not allow: the core decides.
        bot = files_only(chat.room, "f-2", sender_is_bot=True)
        stranger = files_only(chat.room, "f-3", sender="stranger")
        assert await chat.sink(bot) is Accepted.IGNORED
        assert await chat.sink(stranger) is Accepted.IGNORED
        _, accepted = await chat.say("and now some text")
        assert accepted is Accepted.ACCEPTED
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
        assert service.dispatcher.status(chat.room).waiting == 0
    assert chat.texts(ReplyKind.NOTICE).count(FILES_NOT_SUPPORTED) == 1
    assert chat.texts(ReplyKind.RESULT) == ["and now some text"]
    assert db_rows(tmp_path, "select count(*) from runs") == [(1,)]
    states = db_rows(tmp_path, "select external_id, state from messages order by id")
    assert states[0] == ("f-1", "done")


async def test_in_a_mention_room_only_files_that_mention_the_bot_are_answered(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        write_config(
            tmp_path,
            {
                "rooms": [
                    {
                        "transport": "console",
                        "id": "console",
                        "trigger": "mention",
                        "allowed_users": ["local"],
                    }
                ]
            },
        )
    )
    async with serving(settings) as (_, chat):
        assert chat.sink is not None
        assert await chat.sink(files_only(chat.room, "f-1")) is Accepted.IGNORED
        addressed = files_only(chat.room, "f-2", mentions_bot=True)
        assert await chat.sink(addressed) is Accepted.ACCEPTED
        await chat.wait_until(lambda: FILES_NOT_SUPPORTED in chat.texts(ReplyKind.NOTICE))
    assert chat.texts(ReplyKind.NOTICE) == [FILES_NOT_SUPPORTED]


async def test_files_pending_at_a_crash_are_settled_not_run(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    store = await open_store(settings)
    try:
        await store.accept(files_only(console_room(settings), "f-1"), time.time())
    finally:
        await store.close()
    async with serving(settings) as (service, _):
        assert service.dispatcher.status(console_room(settings)).waiting == 0
    assert db_rows(tmp_path, "select count(*) from runs") == [(0,)]
    assert db_rows(tmp_path, "select state from messages") == [("done",)]

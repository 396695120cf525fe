"""A console room that receives files, and where a run's inbox and prompt put them."""

from __future__ import annotations

import asyncio
import base64
import re
from pathlib import Path

from bridge.config import Settings
from bridge.core.model import (
    Attachment,
    ExternalMessageId,
    InboundMessage,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.transport import FileTooLarge, TransportError
from tests.bridge.chat_room import ChatRoom, serving


class FileRoom(ChatRoom):
    """The test room, serving files by ref from memory (the real transports' fetches
    are tested against Synapse and local-slack)."""

    def __init__(self, room: RoomKey, user: str, files: dict[str, bytes]) -> None:
        super().__init__(room, user)
        self.files = files
        self.fetched: list[str] = []
        self.hang = False
        """Each fetch writes a part, then waits forever (a slow chat server)."""
        self.hanging = asyncio.Event()

    async def fetch_attachment(self, attachment: Attachment, dest: Path, limit_bytes: int) -> None:
        self.fetched.append(attachment.ref)
        if self.hang:
            dest.write_bytes(b"part")
            self.hanging.set()
            await asyncio.Event().wait()
        content = self.files.get(attachment.ref)
        if content is None:
            raise TransportError("console", "no such file")
        if len(content) > limit_bytes:
            dest.write_bytes(content[:limit_bytes])
            raise FileTooLarge("console", limit_bytes)
        dest.write_bytes(content)


def with_files(
    room: RoomKey,
    external_id: str,
    *files: Attachment,
    text: str = "",
    sender: str = "local",
    sender_is_bot: bool = False,
) -> InboundMessage:
    return InboundMessage(
        room,
        UserId(sender),
        text,
        ExternalMessageId(external_id),
        sender_is_bot=sender_is_bot,
        attachments=files,
        sender_name="Local Person",
    )


def console_room(settings: Settings) -> RoomKey:
    return RoomKey(TransportName("console"), RoomId(settings.console.room))


NOTES = Attachment("notes.txt", "text/plain", 11, "ref-notes")


def inbox_path(prompt: str, name: str) -> str:
    match = re.search(rf'File "(\.chatbridge/inbox/run-[0-9a-f]+/{re.escape(name)})"', prompt)
    assert match is not None, prompt
    return match.group(1)


async def prompt_of(settings: Settings, chat: FileRoom, sent: InboundMessage) -> str:
    """The prompt the run of ``sent`` got (the fake claude answers with it)."""
    async with serving(settings, chat) as (_, _room):
        assert chat.sink is not None
        await chat.sink(sent)
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)))
    [prompt] = chat.texts(ReplyKind.RESULT)
    return prompt


PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

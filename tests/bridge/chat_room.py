"""An in-process transport driven by the test: one room, events in, replies recorded.

Inbound it hands the sink new messages, edits and deletions; outbound it
records replies, and can hold every send until the test releases it (a
chat server that answers slowly).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from bridge.config import Settings
from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.transport import (
    Accepted,
    Delivery,
    Duplex,
    InboundSink,
    MessageDeleted,
    MessageEdited,
    RunPhase,
)
from bridge.service import Service, open_store
from bridge.store.base import Store

GUARD_S = 30.0


class ChatRoom(Duplex):
    name = TransportName("console")

    def __init__(self, room: RoomKey, user: str, id_prefix: str = "in") -> None:
        self.room = room
        self.id_prefix = id_prefix
        """Of the ids of the messages said here (two rooms of one chat need their own)."""
        self.user = UserId(user)
        self.sink: InboundSink | None = None
        self.replies: list[Reply] = []
        self.posted_files: list[tuple[Reply, bytes]] = []
        """Files posted, with their bytes as posted."""
        self.phases: dict[ExternalMessageId, RunPhase] = {}
        """The last phase shown on each message (as Slack's reactions)."""
        self.sends_started = 0
        self.changed = asyncio.Event()
        self.sending = asyncio.Event()
        """Cleared: every send waits until it is set again."""
        self.sending.set()
        self._ids = 0

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        self.sink = sink
        ready.set()
        await asyncio.Event().wait()

    async def say(self, text: str, thread: str | None = None) -> tuple[ExternalMessageId, Accepted]:
        """A new message, top-level or in ``thread`` (its root's id)."""
        assert self.sink is not None
        self._ids += 1
        external_id = ExternalMessageId(f"{self.id_prefix}-{self._ids}")
        message = InboundMessage(self.room, self.user, text, external_id, thread=thread)
        return external_id, await self.sink(message)

    async def edited(self, external_id: ExternalMessageId, text: str) -> Accepted:
        assert self.sink is not None
        return await self.sink(MessageEdited(self.room, external_id, text, self.user))

    async def deleted(self, external_id: ExternalMessageId) -> Accepted:
        assert self.sink is not None
        return await self.sink(MessageDeleted(self.room, external_id, UserId("an-admin")))

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        self.sends_started += 1
        self.changed.set()
        await self.sending.wait()
        self.replies.append(reply)
        self.changed.set()
        return ExternalMessageId(f"out-{len(self.replies)}")

    async def send_file(self, reply: Reply, key: str) -> ExternalMessageId | None:
        """Records the file's bytes as posted (the bridge removes its copy afterwards)."""
        assert reply.file is not None
        self.posted_files.append((reply, Path(reply.file).read_bytes()))
        return await self.send(reply)

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        for message_id in message_ids:
            self.phases[message_id] = phase
        self.changed.set()

    async def wait_until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(GUARD_S):
            while not done():
                self.changed.clear()
                await self.changed.wait()

    def texts(self, kind: ReplyKind | None = None) -> list[str]:
        return [r.text for r in self.replies if kind is None or r.kind is kind]


def console_room(settings: Settings) -> RoomKey:
    return RoomKey(TransportName("console"), RoomId(settings.console.room))


@asynccontextmanager
async def serving(
    settings: Settings,
    chat: ChatRoom | None = None,
    wrap_store: Callable[[Store], Store] | None = None,
) -> AsyncIterator[tuple[Service, ChatRoom]]:
    """The service with ``chat`` (default: a new :class:`ChatRoom`) as the console room."""
    if chat is None:
        chat = ChatRoom(console_room(settings), "local")
    store = await open_store(settings)
    try:
        service = Service(settings, wrap_store(store) if wrap_store else store, [chat])
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(service.serve())
            await service.ready.wait()
            yield service, chat
            service.request_stop()
            await task
    finally:
        await store.close()

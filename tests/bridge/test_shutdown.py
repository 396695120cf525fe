"""Shutdown keeps the transports sending until the runs' answers are out.

An in-process transport stands in for a chat server: like the Matrix
transport before the fix, it closes its inbound side and drops its client
when the sink refuses an event (``SinkClosed``), after which it cannot send.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

from bridge.config import Settings, load_settings
from bridge.core.model import (
    ExternalMessageId,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
)
from bridge.core.transport import (
    Accepted,
    Delivery,
    InboundSink,
    RunPhase,
    SinkClosed,
    TransportError,
)
from bridge.service import Service, open_store
from tests.bridge.chat_room import ChatRoom
from tests.bridge.harness import write_config

GUARD_S = 30.0


class ChatServer(ChatRoom):
    """A chat room whose transport, like the Matrix transport before the fix,
    drops its client when the sink refuses an event (``SinkClosed``), after
    which every send fails."""

    def __init__(self, room: RoomKey, user: str) -> None:
        super().__init__(room, user)
        self.client = True
        """The connection to the server; dropped when the sink refuses an event."""
        self.failed_sends: list[str] = []
        self.phase_log: list[RunPhase] = []

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        try:
            await super().run(sink, ready)
        finally:
            self.client = False

    async def deliver(self, text: str) -> Accepted:
        try:
            _, accepted = await self.say(text)
        except SinkClosed:
            self.client = False  # what the Matrix transport did: stop syncing, drop the client
            raise
        return accepted

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        if not self.client:
            self.failed_sends.append(reply.text)
            raise TransportError(self.name, "not connected")
        return await super().send(reply, delivery)

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        self.phase_log.append(phase)
        self.changed.set()

    @property
    def results(self) -> list[str]:
        return self.texts(ReplyKind.RESULT)


def settings(tmp_path: Path, env: Mapping[str, str]) -> Settings:
    return load_settings(
        write_config(tmp_path, {"runner": {"shutdown_grace_s": 60, "on_shutdown": "stop"}}, env=env)
    )


def console_server(s: Settings) -> ChatServer:
    return ChatServer(RoomKey(TransportName("console"), RoomId(s.console.room)), s.console.user)


async def test_a_message_during_the_grace_period_waits_and_the_answer_still_goes_out(
    tmp_path: Path,
) -> None:
    config = settings(tmp_path, {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_SLEEP": "1"})
    store = await open_store(config)
    try:
        server = console_server(config)
        service = Service(config, store, [server])
        serving = asyncio.create_task(service.serve())
        async with asyncio.timeout(GUARD_S):
            await service.ready.wait()
        assert await server.deliver("first job") is Accepted.ACCEPTED
        await server.wait_until(lambda: RunPhase.RUNNING in server.phase_log)
        service.request_stop()
        async with asyncio.timeout(GUARD_S):
            await service.shutting_down.wait()
        # Arrives during the grace period: recorded durably, not run now.
        assert await server.deliver("late job") is Accepted.ACCEPTED
        assert await service.readiness() == "shutting down"
        async with asyncio.timeout(GUARD_S):
            await serving
        assert server.failed_sends == []
        assert server.results == ["first job"]
        assert [m.text for m in await store.pending_messages()] == ["late job"]
        last = await store.last_run(server.room)
        assert last is not None
        assert last.report is not None
        assert last.report.status.value == "succeeded"
        assert [m.text for m in await store.messages(last.message_ids)] == ["first job"]
    finally:
        await store.close()

    # After the restart the late message runs.
    store = await open_store(config)
    try:
        server = console_server(config)
        service = Service(config, store, [server])
        serving = asyncio.create_task(service.serve())
        await server.wait_until(lambda: bool(server.results))
        assert server.results == ["late job"]
        service.request_stop()
        async with asyncio.timeout(GUARD_S):
            await serving
        assert await store.pending_messages() == []
    finally:
        await store.close()

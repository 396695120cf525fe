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
    InboundEvent,
    InboundSink,
    RunPhase,
    SinkClosed,
    TransportError,
)
from bridge.service import Service, open_store
from tests.bridge.harness import write_config
from transports.base import Transport

GUARD_S = 30.0


class ChatServer(Transport):
    """A transport driven by the test: it hands events to the sink and records replies."""

    name = TransportName("console")

    def __init__(self, room: RoomKey, user: str) -> None:
        self.room = room
        self.user = UserId(user)
        self.sink: InboundSink | None = None
        self.client = True
        """The connection to the server; dropped when the sink refuses an event."""
        self.replies: list[Reply] = []
        self.failed_sends: list[str] = []
        self.phases: list[RunPhase] = []
        self.changed = asyncio.Event()
        self._ids = 0

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        self.sink = sink
        ready.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.client = False

    async def deliver(self, text: str) -> Accepted:
        assert self.sink is not None
        self._ids += 1
        event: InboundEvent = InboundMessage(
            self.room, self.user, text, ExternalMessageId(f"ev-{self._ids}")
        )
        try:
            return await self.sink(event)
        except SinkClosed:
            self.client = False  # what the Matrix transport did: stop syncing, drop the client
            raise

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        if not self.client:
            self.failed_sends.append(reply.text)
            raise TransportError(self.name, "not connected")
        self.replies.append(reply)
        self.changed.set()
        return ExternalMessageId(f"out-{len(self.replies)}")

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        self.phases.append(phase)
        self.changed.set()

    async def wait_until(self, done: object) -> None:
        async with asyncio.timeout(GUARD_S):
            while not (done() if callable(done) else done):
                self.changed.clear()
                await self.changed.wait()

    @property
    def results(self) -> list[str]:
        return [r.text for r in self.replies if r.kind is ReplyKind.RESULT]


def settings(tmp_path: Path, env: Mapping[str, str]) -> Settings:
    return load_settings(write_config(tmp_path, {"runner": {"shutdown_grace_s": 60}}, env=env))


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
        await server.wait_until(lambda: RunPhase.RUNNING in server.phases)
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
        await server.wait_until(lambda: server.results)
        assert server.results == ["late job"]
        service.request_stop()
        async with asyncio.timeout(GUARD_S):
            await serving
        assert await store.pending_messages() == []
    finally:
        await store.close()

"""A SlackTransport running against local-slack, with a sink that records."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bridge.core.http_limits import ClientLimits
from bridge.core.model import InboundMessage, RoomId
from bridge.core.transport import Accepted, InboundEvent, RoomBinding, SeenMarks
from tests.transports.slack import peer
from transports.backoff import Backoff
from transports.slack.settings import SlackSettings
from transports.slack.transport import SlackTransport


def require_local_slack() -> None:
    """Skip (fail under CI) unless local-slack is installed and may be started here."""
    problem = None
    if not peer.binary().is_file():
        problem = f"local-slack not installed at {peer.binary()} ({peer.INSTALL_HINT})"
    elif reason := peer.private_network_reason():
        problem = f"not in a private network namespace: {reason} ({peer.INSTALL_HINT})"
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(problem)
    pytest.skip(problem)


@dataclass
class RecordingSink:
    """The service's sink, recording what it is handed; can be told to fail."""

    received: list[InboundEvent] = field(default_factory=list)
    fail_next: int = 0
    answer: Accepted = Accepted.ACCEPTED
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def __call__(self, message: InboundEvent) -> Accepted:
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("store unavailable")
        async with self.changed:
            self.received.append(message)
            self.changed.notify_all()
        return self.answer

    async def wait_for(self, count: int, timeout: float = 10) -> list[InboundEvent]:
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(lambda: len(self.received) >= count)
        return list(self.received)

    @property
    def messages(self) -> list[InboundMessage]:
        """What was received, less edits and deletions."""
        return [m for m in self.received if isinstance(m, InboundMessage)]

    @property
    def texts(self) -> list[str]:
        return [m.text for m in self.messages]


@dataclass
class Running:
    slack: peer.LocalSlack
    transport: SlackTransport
    sink: RecordingSink


def slack_settings(mode: str, api_url: str, **overrides: Any) -> SlackSettings:
    values: dict[str, Any] = {
        "mode": mode,
        "bot_token": peer.BOT_TOKEN,
        "app_token": peer.APP_TOKEN,
        "signing_secret": peer.SIGNING_SECRET,
        "api_url": api_url,
    }
    values.update(overrides)
    return SlackSettings.model_validate(values)


DEFAULT_ROOMS = (
    RoomBinding(RoomId(peer.CHANNEL), reply_in_thread=True),
    RoomBinding(RoomId(peer.DM), reply_in_thread=False),
)


@contextlib.asynccontextmanager
async def running(
    tmp: Path,
    mode: str,
    rooms: tuple[RoomBinding, ...] = DEFAULT_ROOMS,
    sink: RecordingSink | None = None,
    configure: Callable[[SlackSettings], SlackSettings] = lambda s: s,
    *,
    limits: ClientLimits | None = None,
    **overrides: Any,
) -> AsyncIterator[Running]:
    """local-slack plus a connected transport; everything stopped on exit."""
    require_local_slack()
    events_port = peer.free_port() if mode == "events" else None
    async with peer.run_local_slack(tmp, mode, events_port) as slack:
        if events_port is not None:
            overrides.setdefault("listen", f"127.0.0.1:{events_port}")
        settings = configure(slack_settings(mode, slack.api_url, **overrides))
        async with connected(slack, settings, rooms, sink, limits=limits) as running:
            yield running


@contextlib.asynccontextmanager
async def connected(
    slack: peer.LocalSlack,
    settings: SlackSettings,
    rooms: tuple[RoomBinding, ...] = DEFAULT_ROOMS,
    sink: RecordingSink | None = None,
    *,
    marks: SeenMarks | None = None,
    wall: Callable[[], float] = time.time,
    limits: ClientLimits | None = None,
) -> AsyncIterator[Running]:
    """A transport connected to a running local-slack; stopped on exit."""
    transport = SlackTransport(
        settings,
        rooms,
        marks=marks,
        backoff=Backoff(base=0.05, cap=0.5),
        wall=wall,
        http_limits=limits,
    )
    sink = sink or RecordingSink()
    ready = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(transport.run(sink, ready))
        async with asyncio.timeout(10):
            await ready.wait()
        try:
            yield Running(slack, transport, sink)
        finally:
            task.cancel()

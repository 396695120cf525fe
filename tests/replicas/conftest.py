"""Replicas in one process: two services on one PostgreSQL database, each with its
own in-process Slack-named transport (docs/replicas.md)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bridge.cluster.replica import Notice
from bridge.config import Settings, load_settings
from bridge.core.model import RoomId, RoomKey, TransportName
from bridge.service import Service, open_store
from bridge.store.migrate import migrate
from tests.bridge.chat_room import ChatRoom
from tests.bridge.harness import ECHO, write_config
from tests.config_files import merged
from tests.store.conftest import create_database, drop_database, postgres_admin_url, unique_name

STATE_ENV = "CHATBRIDGE_RUNNER__STATE_DIR"
ROOM = RoomKey(TransportName("slack"), RoomId("C1"))


class SlackRoom(ChatRoom):
    """The test's chat room, named as a Slack transport (replicas serve Slack rooms)."""

    name = TransportName("slack")


@pytest.fixture
def cluster_db() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test, dropped after it."""
    admin = postgres_admin_url()
    name = unique_name("replicas")
    asyncio.run(create_database(admin, name))
    from tests.store.conftest import with_database

    url = with_database(admin, name)
    asyncio.run(migrate(url))
    try:
        yield url
    finally:
        asyncio.run(drop_database(admin, name))


def replica_settings(
    tmp_path: Path,
    name: str,
    url: str,
    config: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] = ECHO,
) -> Settings:
    home = tmp_path / name
    home.mkdir(exist_ok=True)
    base = {
        "database": {"url": url},
        "console": {"enabled": False},
        "slack": {"bot_token": "xoxb-test", "app_token": "xapp-test"},
        "rooms": [{"transport": "slack", "id": ROOM.room_id, "allowed_users": ["U1"]}],
        "cluster": {"enabled": True, "replica_id": name, "lease_ttl_s": 4, "poll_s": 0.2},
        "dispatcher": {"coalesce_ms": 50, "max_wait_ms": 500},
    }
    path = write_config(home, merged(base, dict(config or {})), env=env)
    # Each replica its own state directory (the suite's fixture sets one for all).
    saved = os.environ.get(STATE_ENV)
    os.environ[STATE_ENV] = str(home / "state")
    try:
        return load_settings(path)
    finally:
        if saved is None:
            del os.environ[STATE_ENV]
        else:
            os.environ[STATE_ENV] = saved


@dataclass
class Replica:
    name: str
    service: Service
    chat: ChatRoom
    task: asyncio.Task[None]

    def die(self) -> None:
        """As abrupt as in-process can be: cancelled, no graceful hand-over."""
        self.task.cancel()


@asynccontextmanager
async def replica(settings: Settings, chat: ChatRoom | None = None) -> AsyncIterator[Replica]:
    if chat is None:
        chat = SlackRoom(ROOM, "U1", id_prefix=f"{settings.cluster.replica_id}-in")
    store = await open_store(settings)
    service = Service(settings, store, [chat])
    task = asyncio.ensure_future(service.serve())
    try:
        ready = asyncio.ensure_future(service.ready.wait())
        await asyncio.wait({ready, task}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            ready.cancel()
            task.result()
        yield Replica(settings.cluster.replica_id or "", service, chat, task)
    finally:
        if not task.done():
            service.request_stop()
        await asyncio.wait({task})
        await store.close()


Factory = Callable[..., Settings]


def held_room_stops(r: Replica) -> asyncio.Event:
    """Hold ``r``'s handling of every room-stop notice until the returned event is set:
    as when its poll loop is busy and hears the notice late."""
    cluster = r.service.parts.cluster
    assert cluster is not None
    heard = cluster.on_notice
    assert heard is not None
    released = asyncio.Event()

    async def late(notice: Notice) -> None:
        if notice.kind == "room-stop":
            await released.wait()
        await heard(notice)

    cluster.on_notice = late
    return released


async def until(done: Callable[[], bool], guard_s: float = 30.0) -> None:
    """Until ``done()``, for state no event announces (a dispatcher's queue on a
    replica): looked at every few milliseconds, failing after ``guard_s``."""
    async with asyncio.timeout(guard_s):
        while not done():
            await asyncio.sleep(0.01)

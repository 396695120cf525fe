"""Test-side Matrix parts: a human on a nio client, a recording sink, a running bridge.

Waiting is done by long-polling the homeserver or awaiting conditions, never
by sleeping; every wait is bounded so a broken bridge fails fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from nio import (
    AsyncClient,
    AsyncClientConfig,
    ErrorResponse,
    MessageDirection,
    RoomCreateResponse,
    RoomMessagesResponse,
    RoomSendResponse,
    SyncResponse,
)

from bridge.core.model import InboundMessage
from bridge.core.transport import Accepted, InboundEvent
from tests.transports.matrix.synapse_peer import MatrixUser
from transports.matrix import MatrixTransport

WAIT_S = 30.0
TransportFactory = Callable[..., MatrixTransport]
"""``make(rooms, **settings_overrides)``: a bridge over the test's store directory."""
ENCRYPTION_STATE = {
    "type": "m.room.encryption",
    "state_key": "",
    "content": {"algorithm": "m.megolm.v1.aes-sha2"},
}


@dataclass(frozen=True)
class Seen:
    """One event a human saw: its room, its raw JSON, and nio's parsed object."""

    room_id: str
    source: dict[str, Any]
    event: object
    ephemeral: bool = False

    @property
    def content(self) -> dict[str, Any]:
        content = self.source.get("content", {})
        return content if isinstance(content, dict) else {}


class Human:
    """A person in a Matrix client, with end-to-end encryption."""

    def __init__(self, homeserver: str, user: MatrixUser, store: Path) -> None:
        store.mkdir(parents=True, exist_ok=True)
        self.user = user
        self.client = AsyncClient(
            homeserver,
            user.user_id,
            device_id=user.device_id,
            store_path=str(store),
            config=AsyncClientConfig(encryption_enabled=True, store_sync_tokens=False),
        )
        self.client.restore_login(user.user_id, user.device_id, user.access_token)
        self.seen: list[Seen] = []
        self.rooms: set[str] = set()
        """The rooms this test made or joined: the only ones synced, so rooms
        left over from earlier tests on the shared server cost nothing."""

    async def start(self) -> None:
        """Upload keys and take the current position: earlier history is not 'seen'."""
        await self.sync(timeout_ms=0, record=False)

    async def close(self) -> None:
        await self.client.close()

    async def sync(self, timeout_ms: int = 1000, *, record: bool = True) -> None:
        client = self.client
        response = await client.sync(
            timeout=timeout_ms,
            sync_filter={"room": {"rooms": sorted(self.rooms)}, "presence": {"not_types": ["*"]}},
        )
        assert isinstance(response, SyncResponse), response
        if client.should_upload_keys:
            await client.keys_upload()
        if client.should_query_keys:
            await client.keys_query()
        if client.should_claim_keys:
            await client.keys_claim(client.get_users_for_key_claiming())
        await client.send_to_device_messages()
        if not record:
            return
        for room_id, info in response.rooms.join.items():
            for event in info.timeline.events:
                self.seen.append(Seen(room_id, dict(event.source), event))
            for event in info.ephemeral:
                source = {"type": type(event).__name__, "users": getattr(event, "users", None)}
                self.seen.append(Seen(room_id, source, event, ephemeral=True))

    async def wait_for(self, predicate: Callable[[Seen], bool], timeout: float = WAIT_S) -> Seen:
        """The first event (seen already or arriving) that matches."""
        async with asyncio.timeout(timeout):
            checked = 0
            while True:
                for seen in self.seen[checked:]:
                    if predicate(seen):
                        return seen
                checked = len(self.seen)
                await self.sync()

    async def wait_for_all(
        self, predicate: Callable[[Seen], bool], count: int, timeout: float = WAIT_S
    ) -> list[Seen]:
        """At least ``count`` matching events, in arrival order."""
        async with asyncio.timeout(timeout):
            while True:
                found = [s for s in self.seen if predicate(s)]
                if len(found) >= count:
                    return found
                await self.sync()

    async def create_room(self, invite: list[str], *, encrypted: bool = False) -> str:
        response = await self.client.room_create(
            invite=invite, initial_state=[ENCRYPTION_STATE] if encrypted else []
        )
        assert isinstance(response, RoomCreateResponse), response
        room_id: str = response.room_id
        self.rooms.add(room_id)
        return room_id

    async def send(
        self,
        room_id: str,
        text: str,
        *,
        msgtype: str = "m.text",
        extra: dict[str, Any] | None = None,
    ) -> str:
        content: dict[str, Any] = {"msgtype": msgtype, "body": text, **(extra or {})}
        if self.client.olm and room_id not in self.client.rooms:
            await self.sync(timeout_ms=0)
        response = await self.client.room_send(
            room_id, "m.room.message", content, ignore_unverified_devices=True
        )
        assert isinstance(response, RoomSendResponse), response
        event_id: str = response.event_id
        return event_id

    async def history(self, room_id: str, sender: str) -> list[dict[str, Any]]:
        """The room messages of ``sender`` the server holds, oldest first (unencrypted rooms).

        Read back from the server rather than from syncs: a sync after many
        events carries only the latest few.
        """
        response = await self.client.room_messages(
            room_id, start="", direction=MessageDirection.back, limit=1000
        )
        assert isinstance(response, RoomMessagesResponse), response
        events = [dict(e.source) for e in reversed(response.chunk)]
        return [e for e in events if e.get("sender") == sender and e["type"] == "m.room.message"]

    async def join(self, room_id: str) -> None:
        response = await self.client.join(room_id)
        assert not isinstance(response, ErrorResponse), response
        self.rooms.add(room_id)

    async def highlights(self, room_id: str) -> list[str]:
        """The bodies of this user's highlighted notifications in ``room_id``, as the
        homeserver's own push rules decided them (``GET /notifications``)."""
        async with aiohttp.ClientSession() as http:
            response = await http.get(
                f"{self.client.homeserver}/_matrix/client/v3/notifications",
                params={"only": "highlight"},
                headers={"Authorization": f"Bearer {self.user.access_token}"},
            )
            assert response.status == 200
            found = (await response.json())["notifications"]
        return [n["event"]["content"]["body"] for n in found if n["room_id"] == room_id]

    async def membership(self, room_id: str, user_id: str) -> str | None:
        response = await self.client.room_get_state_event(room_id, "m.room.member", user_id)
        if isinstance(response, ErrorResponse):
            return None
        membership = response.content.get("membership")
        return str(membership) if membership else None


def joined(user_id: str, room_id: str) -> Callable[[Seen], bool]:
    """Predicate: ``user_id`` joined ``room_id``."""

    def match(seen: Seen) -> bool:
        return (
            seen.room_id == room_id
            and seen.source.get("type") == "m.room.member"
            and seen.source.get("state_key") == user_id
            and seen.content.get("membership") == "join"
        )

    return match


def message_from(user_id: str, room_id: str) -> Callable[[Seen], bool]:
    """Predicate: a (decrypted) room message from ``user_id`` in ``room_id``."""

    def match(seen: Seen) -> bool:
        return (
            seen.room_id == room_id
            and seen.source.get("type") == "m.room.message"
            and seen.source.get("sender") == user_id
        )

    return match


class RecordingSink:
    """The service's sink, recording what it is given; waits are condition-based."""

    def __init__(self) -> None:
        self.events: list[InboundEvent] = []
        self._changed = asyncio.Condition()

    @property
    def messages(self) -> list[InboundMessage]:
        return [e for e in self.events if isinstance(e, InboundMessage)]

    async def __call__(self, event: InboundEvent) -> Accepted:
        async with self._changed:
            self.events.append(event)
            self._changed.notify_all()
        return Accepted.ACCEPTED

    async def wait_for_event(self, wanted: InboundEvent, timeout: float = WAIT_S) -> None:
        """Until exactly this event was delivered."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: wanted in self.events)

    async def wait_for_text(self, text: str, timeout: float = WAIT_S) -> InboundMessage:
        """The first delivered message with exactly this text."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: any(m.text == text for m in self.messages))
        return next(m for m in self.messages if m.text == text)

    def texts(self, room_id: str | None = None) -> list[str]:
        return [m.text for m in self.messages if room_id is None or m.room.room_id == room_id]


@asynccontextmanager
async def running(
    transport: MatrixTransport, sink: RecordingSink, timeout: float = WAIT_S
) -> AsyncIterator[asyncio.Task[None]]:
    """Run the transport until the block ends; cancellation must end it as cancelled."""
    ready = asyncio.Event()
    task = asyncio.create_task(transport.run(sink, ready), name="matrix-under-test")
    try:
        async with asyncio.timeout(timeout):
            done, _ = await asyncio.wait(
                [task, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED
            )
        if task in done:
            task.result()  # raises what ended it
            raise AssertionError("transport returned before it was ready")
        assert transport.connected
        yield task
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("transport swallowed cancellation")
    assert task.cancelled()

"""Rooms, people and rows that the store's contract tests write."""

from __future__ import annotations

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    Message,
    RoomId,
    RoomKey,
    RunId,
    TransportName,
    UserId,
)
from tests.store.conftest import InspectableStore

ROOM = RoomKey(TransportName("matrix"), RoomId("!a:localhost"))


OTHER_ROOM = RoomKey(TransportName("matrix"), RoomId("!b:localhost"))


SLACK_ROOM = RoomKey(TransportName("slack"), RoomId("!a:localhost"))  # same id, other transport


ALICE = UserId("@alice:localhost")


def inbound(
    external_id: str, room: RoomKey = ROOM, text: str = "hello", thread: str | None = None
) -> InboundMessage:
    return InboundMessage(
        room=room,
        sender=ALICE,
        text=text,
        external_id=ExternalMessageId(external_id),
        thread=thread,
    )


async def accept(
    store: InspectableStore, external_id: str, at: float = 100.0, room: RoomKey = ROOM
) -> Message:
    message = await store.accept(inbound(external_id, room), at)
    assert message is not None
    return message


async def start(
    store: InspectableStore, run_id: str, messages: list[Message], at: float = 200.0
) -> RunId:
    rid = RunId(run_id)
    await store.start_run(rid, Batch(messages[0].room, tuple(messages)), at)
    return rid

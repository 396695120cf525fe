"""Reactions on the bot's approval requests, sent and read back by a human client."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from nio import Api, RoomSendResponse

from tests.transports.matrix.matrix_helpers import Human, Seen

BOT = "@chatbridge:localhost"


async def react(
    human: Human, room_id: str, event_id: str, emoji: str, *, encrypt: bool = False
) -> str:
    """React as ``human``; ``encrypt`` as Element does in an encrypted room.

    (nio's ``room_send`` never encrypts a reaction; the group session was
    shared by a message ``human`` sent before.)
    """
    content: dict[str, Any] = {
        "m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": emoji}
    }
    client = human.client
    if not encrypt:
        response = await client.room_send(room_id, "m.reaction", content)
    else:
        kind, sealed = client.encrypt(room_id, "m.reaction", content)
        assert kind == "m.room.encrypted"
        assert "ciphertext" in sealed
        method, path, data = Api.room_send(client.access_token, room_id, kind, sealed, uuid4().hex)
        response = await client._send(
            RoomSendResponse, method, path, data, response_data=(room_id,)
        )
    assert isinstance(response, RoomSendResponse), response
    return str(response.event_id)


def reaction_of(sender: str, event_id: str) -> Any:
    def match(seen: Seen) -> bool:
        relates = seen.content.get("m.relates_to") or {}
        return (
            seen.source.get("type") == "m.reaction"
            and seen.source.get("sender") == sender
            and relates.get("event_id") == event_id
        )

    return match


async def offered(alice: Human, event_id: str) -> list[str]:
    """The reactions the bot put on ``event_id``, as alice sees them.

    (Sent in the clear even in an encrypted room: nio does not encrypt reactions.)
    """
    seen = await alice.wait_for_all(reaction_of(BOT, event_id), 3)
    return [s.content["m.relates_to"]["key"] for s in seen]

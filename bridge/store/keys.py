"""How a conversation's key is kept in the ``transport`` and ``room_id`` columns."""

from __future__ import annotations

from bridge.core.model import RoomId, RoomKey, TransportName

THREAD_SEPARATOR = "/"
"""Between a room's id and its thread's in the ``room_id`` columns of a thread
conversation: room ids never hold one (Slack's are alphanumeric, Matrix's
``!opaque:server``, the console's are checked), thread ids may."""


def stored_id(room: RoomKey) -> str:
    """``room``'s ``room_id`` column: the room's id, and its thread's for a thread
    conversation, so every table keeps one column per conversation."""
    return f"{room.room_id}{THREAD_SEPARATOR}{room.thread}" if room.thread else room.room_id


def room_key(transport: str, room_id: str) -> RoomKey:
    """The conversation a row's ``transport`` and ``room_id`` name."""
    room, _, thread = room_id.partition(THREAD_SEPARATOR)
    return RoomKey(TransportName(transport), RoomId(room), thread)

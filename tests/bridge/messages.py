"""Inbound messages as the prompt builder receives them."""

from __future__ import annotations

from bridge.core.model import (
    Attachment,
    ExternalMessageId,
    Message,
    MessageId,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)

ROOM = RoomKey(TransportName("matrix"), RoomId("!r:hs"))


def msg(
    n: int,
    text: str,
    *,
    sender: str = "@alice:hs",
    name: str | None = "Alice",
    reply: str | None = None,
    files: tuple[Attachment, ...] = (),
) -> Message:
    return Message(
        id=MessageId(n),
        room=ROOM,
        sender=UserId(sender),
        text=text,
        external_id=ExternalMessageId(f"$e{n}"),
        received_at=0.0,
        sender_name=name,
        reply_to_text=reply,
        attachments=files,
    )

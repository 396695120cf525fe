"""Translating Matrix room events into inbound messages, and the rules for skipping.

Pure functions over nio event objects: no I/O, so every rule here is tested
without a server.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from nio import RoomMessageNotice, RoomMessageText

from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)

TRANSPORT = TransportName("matrix")


@dataclass(frozen=True, slots=True)
class InboundPolicy:
    """How inbound events are read: who the bot is (its own events, mentions of it)
    and whom it treats as a bot."""

    user_id: str
    ignore_other_bots: bool
    ignore_users: Collection[str]


def relation(content: dict[str, Any]) -> dict[str, Any]:
    rel = content.get("m.relates_to")
    return rel if isinstance(rel, dict) else {}


def is_edit(content: dict[str, Any]) -> bool:
    """An ``m.replace`` relation: an edit of an earlier message."""
    return relation(content).get("rel_type") == "m.replace"


def thread_of(content: dict[str, Any]) -> str | None:
    """The thread root's event id, for a message inside a thread."""
    rel = relation(content)
    if rel.get("rel_type") == "m.thread" and isinstance(rel.get("event_id"), str):
        return str(rel["event_id"])
    return None


def strip_reply_fallback(body: str, content: dict[str, Any]) -> str:
    """Drop the ``> <@user> quoted`` lines old clients prepend to a reply's body."""
    if "m.in_reply_to" not in relation(content) or not body.startswith("> "):
        return body
    lines = body.split("\n")
    i = 0
    while i < len(lines) and lines[i].startswith(">"):
        i += 1
    return "\n".join(lines[i:]).lstrip("\n")


def mentions(content: dict[str, Any], body: str, user_id: str) -> bool:
    """Whether the message mentions ``user_id``.

    Modern clients declare it in ``m.mentions``; older ones put a pill (a
    matrix.to link) in ``formatted_body``; a typed id in the text counts too.
    """
    declared = content.get("m.mentions")
    if isinstance(declared, dict):
        ids = declared.get("user_ids")
        if isinstance(ids, list) and user_id in ids:
            return True
    html = content.get("formatted_body")
    if isinstance(html, str) and f"matrix.to/#/{user_id}" in html:
        return True
    return user_id in body


def to_inbound(event: object, room_id: str, bot: InboundPolicy) -> InboundMessage | None:
    """The inbound message an event carries, or None if it carries none for the bridge.

    Skipped: anything but ``m.text``/``m.notice`` messages, the bridge's own
    events, and edits (the original was already delivered; an edit must not
    start a second run). Notices and ``ignore_users`` are delivered marked
    as bots when ``ignore_other_bots`` is set, so the service can record them.
    """
    if not isinstance(event, RoomMessageText | RoomMessageNotice):
        return None
    if event.sender == bot.user_id:
        return None
    content = event.source.get("content", {})
    if not isinstance(content, dict) or is_edit(content):
        return None
    is_notice = isinstance(event, RoomMessageNotice)
    sender_is_bot = bot.ignore_other_bots and (is_notice or event.sender in bot.ignore_users)
    body = strip_reply_fallback(event.body, content)
    return InboundMessage(
        room=RoomKey(TRANSPORT, RoomId(room_id)),
        sender=UserId(event.sender),
        text=body,
        external_id=ExternalMessageId(event.event_id),
        thread=thread_of(content),
        sender_is_bot=sender_is_bot,
        mentions_bot=mentions(content, body, bot.user_id),
    )


def is_own_join(event: object, user_id: str) -> bool:
    """The bridge's own membership becoming ``join`` (what came before is history)."""
    source = getattr(event, "source", None)
    if not isinstance(source, dict) or source.get("type") != "m.room.member":
        return False
    content = source.get("content", {})
    prev = source.get("unsigned", {}).get("prev_content", {}) or {}
    return (
        source.get("state_key") == user_id
        and isinstance(content, dict)
        and content.get("membership") == "join"
        and prev.get("membership") != "join"
    )

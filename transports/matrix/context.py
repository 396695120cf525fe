"""What the room knows about a message beyond its event: the sender's display name,
the names behind its pills, and the text of the message it replies to.

Names come from the room's member state, which the sync keeps current (nio's
room objects), so they need no cache of their own and cost no request. The
replied-to message is fetched (``room_get_event``, decrypted when the bot
holds its key), once per reply, bounded in time; when it cannot be had the
message goes on without it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import html
import logging
import re
from typing import Any

from nio import AsyncClient, MegolmEvent, RoomGetEventResponse
from nio.exceptions import EncryptionError, LocalProtocolError

from bridge.core.model import InboundMessage
from bridge.core.text import safe_text
from transports.matrix.inbound import relation, strip_reply_fallback
from transports.matrix.media import MEDIA_TYPES, file_name

log = logging.getLogger(__name__)

REPLY_LOOKUP_S = 5.0
"""Fetching a replied-to message gives up after this long (the message goes on without it)."""
_PILL_TARGET = re.compile(r"<a\s[^>]*href=\"https://matrix\.to/#/(@[^\"/?]+)[^\"]*\"", re.I)


def display_name(client: AsyncClient, room_id: str, user_id: str) -> str | None:
    """``user_id``'s display name in the room, if it set one."""
    room = client.rooms.get(room_id)
    user = room.users.get(user_id) if room is not None else None
    name = getattr(user, "display_name", None)
    return name if isinstance(name, str) and name.strip() else None


def named_pills(body: str, content: dict[str, Any], names: dict[str, str]) -> str:
    """``body`` with the user ids its pills link to written as ``@display name``.

    Most clients already write the name in the body; some write the id. Only
    ids that a pill links to are replaced, so a typed id stays as typed.
    """
    formatted = content.get("formatted_body")
    if not isinstance(formatted, str):
        return body
    for user_id in dict.fromkeys(html.unescape(m) for m in _PILL_TARGET.findall(formatted)):
        name = names.get(user_id)
        if name and user_id in body:
            body = body.replace(user_id, f"@{name}")
    return body


def replied_to(content: dict[str, Any]) -> str | None:
    """The event id a message replies to, if it is a reply.

    A message in a thread carries a reply to the thread's latest event only as a
    fallback for clients that show no threads (``is_falling_back``): that is
    not a reply, and the thread is context already.
    """
    rel = relation(content)
    if rel.get("rel_type") == "m.thread" and rel.get("is_falling_back") is True:
        return None
    reply = rel.get("m.in_reply_to")
    event_id = reply.get("event_id") if isinstance(reply, dict) else None
    return event_id if isinstance(event_id, str) else None


def quoted_text(content: dict[str, Any]) -> str | None:
    """What a replied-to message said: its text without its own reply fallback,
    or its file's name."""
    if content.get("msgtype") in MEDIA_TYPES:
        return f"(a file: {file_name(content)})"
    body = content.get("body")
    if not isinstance(body, str):
        return None
    return safe_text(strip_reply_fallback(body, content))


async def with_context(
    client: AsyncClient, room_id: str, inbound: InboundMessage, content: dict[str, Any]
) -> InboundMessage:
    """``inbound`` with its sender's name, its pills named and the replied-to text."""
    room = client.rooms.get(room_id)
    names: dict[str, str] = {}
    if room is not None:
        for user_id, user in room.users.items():
            name = getattr(user, "display_name", None)
            if isinstance(name, str) and name.strip():
                names[user_id] = name
    reply_to = replied_to(content)
    return dataclasses.replace(
        inbound,
        sender_name=names.get(inbound.sender),
        text=named_pills(inbound.text, content, names),
        reply_to_text=None if reply_to is None else await _fetch_text(client, room_id, reply_to),
    )


async def _fetch_text(client: AsyncClient, room_id: str, event_id: str) -> str | None:
    try:
        async with asyncio.timeout(REPLY_LOOKUP_S):
            response = await client.room_get_event(room_id, event_id)
    except TimeoutError:
        log.info("matrix: the replied-to message %s did not come in time", event_id)
        return None
    if not isinstance(response, RoomGetEventResponse):
        log.info("matrix: cannot fetch the replied-to message %s: %s", event_id, response)
        return None
    event: object = response.event
    if isinstance(event, MegolmEvent) and client.olm is not None:
        try:
            event = client.decrypt_event(event)
        except (EncryptionError, LocalProtocolError):
            log.info("matrix: cannot decrypt the replied-to message %s", event_id)
            return None
    source = getattr(event, "source", None)
    content = source.get("content") if isinstance(source, dict) else None
    return quoted_text(content) if isinstance(content, dict) else None

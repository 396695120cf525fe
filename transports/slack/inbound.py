"""Slack ``message`` / ``app_mention`` events to :class:`~bridge.core.model.InboundMessage`.

Pure functions over the event dict, so the filtering rules (which events are
new human text, who is a bot, what is a mention) are tested without a peer.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)

SLACK = TransportName("slack")

# Subtypes that still carry new text typed by a person; every other subtype
# (edits, deletions, joins, topic changes, bot posts...) is not a new message.
HUMAN_SUBTYPES = frozenset({"thread_broadcast", "file_share", "me_message"})
# Passed on, flagged as a bot's, so the service can record why it ignored them.
BOT_SUBTYPE = "bot_message"


def mentions(text: str, user_id: str) -> bool:
    """True if ``text`` contains Slack's mention markup for ``user_id`` (``<@U123>``)."""
    return re.search(rf"<@{re.escape(user_id)}(?:\|[^>]*)?>", text) is not None


def to_inbound(
    event: Mapping[str, Any], bot_user_id: str, bot_id: str | None, rooms: frozenset[str]
) -> InboundMessage | None:
    """The message in ``event``, or None when it is not for the bridge.

    None for: other event types, rooms not configured, the bridge's own posts
    (cheap to drop here, and echoing them would loop), subtypes that are not
    new human text, and events without a sender or timestamp. Other bots'
    messages are returned flagged ``sender_is_bot`` so the service can decide.
    """
    if event.get("type") not in ("message", "app_mention"):
        return None
    channel = event.get("channel")
    if not isinstance(channel, str) or channel not in rooms:
        return None
    subtype = event.get("subtype")
    if event.get("hidden") or subtype not in (None, BOT_SUBTYPE, *HUMAN_SUBTYPES):
        return None
    user = event.get("user")
    ts = event.get("ts")
    sender_bot_id = event.get("bot_id")
    if user == bot_user_id or (bot_id is not None and sender_bot_id == bot_id):
        return None
    if not isinstance(ts, str):
        return None
    if not isinstance(user, str):
        # Bot posts without a user (legacy integrations) still name their bot.
        if not isinstance(sender_bot_id, str):
            return None
        user = sender_bot_id
    text = event.get("text")
    text = text if isinstance(text, str) else ""
    thread = event.get("thread_ts")
    return InboundMessage(
        room=RoomKey(SLACK, RoomId(channel)),
        sender=UserId(user),
        text=text,
        external_id=ExternalMessageId(ts),
        thread=thread if isinstance(thread, str) else None,
        sender_is_bot=sender_bot_id is not None or subtype == BOT_SUBTYPE,
        mentions_bot=event.get("type") == "app_mention" or mentions(text, bot_user_id),
    )


class RecentKeys:
    """A bounded set of recently handled keys, oldest forgotten first.

    Slack redelivers an event it saw no acknowledgement for, and sends one
    message twice when the app subscribes to both ``message`` and
    ``app_mention``; the store's idempotent accept is the durable guard, this
    just saves it the round trip.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._keys: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._keys

    def add(self, key: tuple[str, str]) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self._size:
            self._keys.popitem(last=False)

"""Slack ``message`` / ``app_mention`` events to the service's inbound events.

Pure functions over the event dict, so the filtering rules (which events are
new human text, edits or deletions, who is a bot, what is a mention) are
tested without a peer. :func:`to_event` returns texts still in Slack's
markup; :func:`decoded` turns them into what the person saw, once the
display names of the users they mention are known.
"""

from __future__ import annotations

import dataclasses
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
from bridge.core.transport import InboundEvent, MessageDeleted, MessageEdited
from transports.slack.decode import decode, mentioned_users, strip_leading_mention
from transports.slack.files import attachments

SLACK = TransportName("slack")

# Subtypes that still carry new text typed by a person; every other subtype
# (joins, topic changes, bot posts...) is not a new message.
HUMAN_SUBTYPES = frozenset({"thread_broadcast", "file_share", "me_message"})
# Passed on, flagged as a bot's, so the service can record why it ignored them.
BOT_SUBTYPE = "bot_message"
EDITED = "message_changed"
DELETED = "message_deleted"
TOMBSTONE = "tombstone"
"""What a deleted thread parent with replies becomes (sent as ``message_changed``)."""


def mentions(text: str, user_id: str) -> bool:
    """True if ``text`` contains Slack's mention markup for ``user_id`` (``<@U123>``)."""
    return re.search(rf"<@{re.escape(user_id)}(?:\|[^>]*)?>", text) is not None


def _by_bridge(message: Mapping[str, Any], bot_user_id: str, bot_id: str | None) -> bool:
    return message.get("user") == bot_user_id or (
        bot_id is not None and message.get("bot_id") == bot_id
    )


def _by_a_bot(message: Mapping[str, Any]) -> bool:
    return message.get("bot_id") is not None or message.get("subtype") == BOT_SUBTYPE


def to_event(
    event: Mapping[str, Any], bot_user_id: str, bot_id: str | None, rooms: frozenset[str]
) -> InboundEvent | None:
    """What ``event`` means to the bridge, or None when it is not for the bridge.

    None for: other event types, rooms not configured, the bridge's own posts
    and edits (echoing them would loop), other bots' edits and deletions,
    subtypes that are not human text, edits that left the text as it was
    (Slack sends ``message_changed`` when a link unfurls), messages with no
    text and no files, and events without a sender or timestamp. Other
    bots' messages are returned flagged ``sender_is_bot`` so the service can
    decide. A leading mention of the bot is removed (``@bot !stop`` is the
    command ``!stop``) and sets ``mentions_bot``.
    """
    if event.get("type") not in ("message", "app_mention"):
        return None
    channel = event.get("channel")
    if not isinstance(channel, str) or channel not in rooms:
        return None
    room = RoomKey(SLACK, RoomId(channel))
    subtype = event.get("subtype")
    if subtype == EDITED:
        return _edited(event, room, bot_user_id, bot_id)
    if subtype == DELETED:
        return _deleted(event, room, bot_user_id, bot_id)
    if event.get("hidden") or subtype not in (None, BOT_SUBTYPE, *HUMAN_SUBTYPES):
        return None
    user = event.get("user")
    ts = event.get("ts")
    sender_bot_id = event.get("bot_id")
    if _by_bridge(event, bot_user_id, bot_id):
        return None
    if not isinstance(ts, str):
        return None
    if not isinstance(user, str):
        # Bot posts without a user (legacy integrations) still name their bot.
        if not isinstance(sender_bot_id, str):
            return None
        user = sender_bot_id
    raw = event.get("text")
    text, leading = strip_leading_mention(raw if isinstance(raw, str) else "", bot_user_id)
    thread = event.get("thread_ts")
    thread = thread if isinstance(thread, str) else None
    files = attachments(event)
    if not text.strip() and not files:
        return None  # a bare mention, or an empty post: nothing to run
    return InboundMessage(
        room=room,
        sender=UserId(user),
        text=text,
        external_id=ExternalMessageId(ts),
        thread=thread,
        sender_is_bot=sender_bot_id is not None or subtype == BOT_SUBTYPE,
        mentions_bot=leading or event.get("type") == "app_mention" or mentions(text, bot_user_id),
        attachments=files,
    )


def _edited(
    event: Mapping[str, Any], room: RoomKey, bot_user_id: str, bot_id: str | None
) -> MessageEdited | MessageDeleted | None:
    """An edit; or a deletion, when the edit leaves nothing of the message.

    Slack reports deleting a thread parent that has replies as a change to a
    ``tombstone`` (posted by Slackbot, "This message was deleted."), and an
    edit can leave no text (``@bot do X`` edited to ``@bot``): both withdraw
    the request, as a deletion does.
    """
    message = event.get("message")
    if not isinstance(message, Mapping):
        return None
    previous = event.get("previous_message")
    previous = previous if isinstance(previous, Mapping) else {}
    ts = message.get("ts")
    if message.get("subtype") == TOMBSTONE:
        if _by_bridge(previous, bot_user_id, bot_id) or _by_a_bot(previous):
            return None
        return MessageDeleted(room, ExternalMessageId(ts)) if isinstance(ts, str) else None
    if _by_bridge(message, bot_user_id, bot_id) or _by_a_bot(message):
        return None  # the bridge's own progress edits, above all
    text = message.get("text")
    if not isinstance(ts, str) or not isinstance(text, str):
        return None
    if previous.get("text") == text:
        return None
    stripped = strip_leading_mention(text, bot_user_id)[0]
    if not stripped.strip():
        return MessageDeleted(room, ExternalMessageId(ts))
    return MessageEdited(room, ExternalMessageId(ts), stripped)


def _deleted(
    event: Mapping[str, Any], room: RoomKey, bot_user_id: str, bot_id: str | None
) -> MessageDeleted | None:
    previous = event.get("previous_message")
    previous = previous if isinstance(previous, Mapping) else {}
    if _by_bridge(previous, bot_user_id, bot_id) or _by_a_bot(previous):
        return None
    ts = event.get("deleted_ts") or previous.get("ts")
    if not isinstance(ts, str):
        return None
    return MessageDeleted(room, ExternalMessageId(ts))


def users_to_name(event: InboundEvent) -> list[str]:
    """The users whose display names :func:`decoded` needs for ``event``: those it
    mentions and, for a message, its sender."""
    if isinstance(event, InboundMessage):
        return list(dict.fromkeys([event.sender, *mentioned_users(event.text)]))
    if isinstance(event, MessageEdited):
        return mentioned_users(event.text)
    return []


def decoded(event: InboundEvent, names: Mapping[str, str]) -> InboundEvent:
    """``event`` with its text as the person saw it (see :mod:`.decode`), and a
    message with its sender's display name."""
    if isinstance(event, InboundMessage):
        return dataclasses.replace(
            event, text=decode(event.text, names), sender_name=names.get(event.sender)
        )
    if isinstance(event, MessageEdited):
        return dataclasses.replace(event, text=decode(event.text, names))
    return event


def dedup_key(event: Mapping[str, Any]) -> tuple[str, str]:
    """What identifies one delivery of ``event`` (a redelivery has the same key)."""
    channel = str(event.get("channel", ""))
    if event.get("subtype") in (EDITED, DELETED):
        return channel, f"{event.get('subtype')}:{event.get('event_ts') or event.get('ts')}"
    return channel, str(event.get("ts", ""))


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

"""Translating Matrix room events into inbound events, and the rules for skipping.

Pure functions over nio event objects: no I/O, so every rule here is tested
without a server.
"""

from __future__ import annotations

import html
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from nio import (
    ReactionEvent,
    RedactionEvent,
    RoomEncryptedMedia,
    RoomMessageMedia,
    RoomMessageNotice,
    RoomMessageText,
    TypingNoticeEvent,
)

from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.text import safe_text
from bridge.core.transport import (
    ApprovalAction,
    ApprovalChoice,
    MessageDeleted,
    MessageEdited,
    Typing,
)
from transports.matrix.approvals import choice_of, number_of
from transports.matrix.media import attachment_of, caption

TRANSPORT = TransportName("matrix")

_FALLBACK_START = re.compile(r"> (?:\* )?<@[^>\s]+:[^>\s]+> ")
"""How a reply fallback opens: ``> <@user:server> quoted`` (``> * <@...>`` for emotes)."""
_PILL = re.compile(r"\s*<a\s+href=\"https://matrix\.to/#/([^\"]+)\"\s*>(.*?)</a>", re.DOTALL)
_AFTER_MENTION = re.compile(r"[:,]?\s+|[:,]$")
"""What separates a mention that is surely one from the text: ``@bot hi``, ``@bot: hi``."""
_AFTER_BARE_NAME = re.compile(r"\s*[:,]\s*|\s+(?=!)")
"""What must follow a bare display name to make it a mention: ``Claude: hi``,
``Claude, hi`` or a command (``Claude !stop``); ``Claude code keeps crashing``
is a sentence about something else."""
_INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff"
"""Zero-width characters that clients and pasting leave in front of a mention."""


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
    """Drop the quote of the replied-to message that clients prepend to a reply's body.

    Only a real fallback goes: the message replies to something, its body
    opens with ``> <@user:server> `` and the quote ends at the first blank
    line. Anything else that starts with ``>`` (pasted log lines, a quote the
    user typed) is the user's text and stays.
    """
    if "m.in_reply_to" not in relation(content) or not _FALLBACK_START.match(body):
        return body
    lines = body.split("\n")
    for i, line in enumerate(lines):
        if line == "":
            return "\n".join(lines[i + 1 :])
        if not line.startswith(">"):
            break
    return body  # no blank line after the quote: not the fallback's shape


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
    formatted = content.get("formatted_body")
    if isinstance(formatted, str) and f"matrix.to/#/{user_id}" in formatted:
        return True
    return user_id in body


def localpart(user_id: str) -> str:
    """``alice`` of ``@alice:hs`` (a Matrix user name)."""
    return user_id[1:].split(":", 1)[0] if user_id.startswith("@") else user_id


def strip_leading_mention(
    body: str, content: dict[str, Any], user_id: str, display_name: str | None
) -> str | None:
    """``body`` without a mention of the bot it starts with; None if it starts with none.

    Sure mentions are followed by a space, a colon or a comma: the bot's id,
    ``@`` and its localpart or display name as typed (``@bot !stop``,
    ``@Claude !stop``), and the text of a pill (a matrix.to link to the bot)
    that opens ``formatted_body``. The bare display name counts only with a
    colon or comma or a command after it (``Claude: hi``, ``Claude !stop``),
    since a sentence may start with the same word. Zero-width characters in
    front are ignored.
    """
    sure = [user_id, f"@{localpart(user_id)}"]
    formatted = content.get("formatted_body")
    if isinstance(formatted, str):
        pill = _PILL.match(formatted.lstrip(_INVISIBLE))
        if pill and pill.group(1) == user_id:
            sure.append(html.unescape(re.sub(r"<[^>]*>", "", pill.group(2))))
    bare = []
    if display_name:
        sure.append(f"@{display_name}")
        bare.append(display_name)
    candidates = [(name, _AFTER_MENTION) for name in sure] + [
        (name, _AFTER_BARE_NAME) for name in bare
    ]
    text = body.lstrip(_INVISIBLE + " \t\n\r")
    for name, separators in sorted(candidates, key=lambda c: len(c[0]), reverse=True):
        if not name or not text.startswith(name):
            continue
        rest = text[len(name) :]
        if rest == "":
            return ""
        separator = separators.match(rest)
        if separator:
            return rest[separator.end() :]
    return None


def to_inbound(
    event: object, room_id: str, bot: InboundPolicy, display_name: str | None = None
) -> InboundMessage | MessageEdited | MessageDeleted | ApprovalAction | None:
    """The inbound event ``event`` carries, or None if it carries none for the bridge.

    Messages: ``m.text``/``m.notice`` from anyone but the bridge. Notices and
    ``ignore_users`` are delivered marked as bots when ``ignore_other_bots``
    is set, so the service can record them. An edit (``m.replace``) becomes
    :class:`MessageEdited` of the original, a redaction :class:`MessageDeleted`:
    the service applies them to messages not yet run and ignores the rest.
    A reaction ✅ 🔁 ❌ (or 1️⃣ … 9️⃣, an answer) by anyone but the bridge (and, with
    ``ignore_other_bots``, but ``ignore_users``) becomes an
    :class:`ApprovalAction` on the event it annotates; whether that event is
    an approval request (a question, for a number) is for the caller to check
    (it takes a lookup), as whether a reply answers a question (:func:`as_answer`).
    ``display_name`` is the bot's name in the room, for leading mentions.
    """
    room = RoomKey(TRANSPORT, RoomId(room_id))
    if isinstance(event, RedactionEvent):
        if event.sender == bot.user_id or not event.redacts:
            return None
        return MessageDeleted(room, ExternalMessageId(event.redacts))
    if isinstance(event, ReactionEvent):
        return _reaction(event, room, bot)
    if isinstance(event, RoomMessageMedia | RoomEncryptedMedia):
        return _files(event, room, bot)
    if not isinstance(event, RoomMessageText | RoomMessageNotice):
        return None
    if event.sender == bot.user_id:
        return None
    content = event.source.get("content", {})
    if not isinstance(content, dict):
        return None
    if is_edit(content):
        return _edit(content, room, bot, display_name)
    is_notice = isinstance(event, RoomMessageNotice)
    sender_is_bot = bot.ignore_other_bots and (is_notice or event.sender in bot.ignore_users)
    body = strip_reply_fallback(safe_text(event.body), content)
    mentioned = mentions(content, body, bot.user_id)
    stripped = strip_leading_mention(body, content, bot.user_id, display_name)
    return InboundMessage(
        room=room,
        sender=UserId(event.sender),
        text=body if stripped is None else stripped,
        external_id=ExternalMessageId(event.event_id),
        thread=thread_of(content),
        sender_is_bot=sender_is_bot,
        mentions_bot=mentioned or stripped is not None,
    )


def _reaction(event: ReactionEvent, room: RoomKey, bot: InboundPolicy) -> ApprovalAction | None:
    if event.sender == bot.user_id:
        return None  # the bot's own reactions: the buttons it offers
    if bot.ignore_other_bots and event.sender in bot.ignore_users:
        return None
    if not event.reacts_to:
        return None
    target = ExternalMessageId(event.reacts_to)
    number = number_of(event.key)
    if number is not None:
        # 1️⃣ … on a question: that option (the caller drops it on anything else).
        return ApprovalAction(room, UserId(event.sender), target, ApprovalChoice.ALLOW, number)
    choice = choice_of(event.key)
    if choice is None:
        return None
    return ApprovalAction(room, UserId(event.sender), target, choice)


def as_answer(message: InboundMessage, question: ExternalMessageId) -> ApprovalAction | None:
    """A message replying to ``question`` (a question request) as its answer; None for a
    bot's."""
    if message.sender_is_bot or not message.text.strip():
        return None
    return ApprovalAction(
        message.room, message.sender, question, ApprovalChoice.ALLOW, message.text.strip()
    )


def _files(
    event: RoomMessageMedia | RoomEncryptedMedia, room: RoomKey, bot: InboundPolicy
) -> InboundMessage | None:
    """A file, image, audio or video: a message with its file, and its caption as text."""
    if event.sender == bot.user_id:
        return None
    content = event.source.get("content", {})
    if not isinstance(content, dict):
        return None
    attachment = attachment_of(content)
    text = safe_text(caption(content))
    if attachment is None and not text.strip():
        return None
    return InboundMessage(
        room=room,
        sender=UserId(event.sender),
        text=text,
        external_id=ExternalMessageId(event.event_id),
        thread=thread_of(content),
        sender_is_bot=event.sender in bot.ignore_users and bot.ignore_other_bots,
        attachments=() if attachment is None else (attachment,),
    )


def _edit(
    content: dict[str, Any], room: RoomKey, bot: InboundPolicy, display_name: str | None
) -> MessageEdited | None:
    original = relation(content).get("event_id")
    new = content.get("m.new_content")
    if not isinstance(original, str) or not isinstance(new, dict):
        return None
    body = new.get("body")
    if not isinstance(body, str):
        return None
    body = safe_text(body)
    stripped = strip_leading_mention(body, new, bot.user_id, display_name)
    return MessageEdited(room, ExternalMessageId(original), body if stripped is None else stripped)


def own_membership(event: object, user_id: str) -> tuple[str, str | None] | None:
    """``(membership, previous membership)`` of an event changing the bot's own
    membership; None for any other event."""
    source = getattr(event, "source", None)
    if not isinstance(source, dict) or source.get("type") != "m.room.member":
        return None
    if source.get("state_key") != user_id:
        return None
    content = source.get("content", {})
    unsigned = source.get("unsigned", {})
    prev = unsigned.get("prev_content", {}) if isinstance(unsigned, dict) else {}
    membership = content.get("membership") if isinstance(content, dict) else None
    previous = prev.get("membership") if isinstance(prev, dict) else None
    return (
        str(membership) if membership else "",
        str(previous) if isinstance(previous, str) else None,
    )


def history_before(events: list[Any], user_id: str) -> int:
    """How many of ``events`` (oldest first) are history from before the bot was asked in.

    The cut is at the bot's invite, not its join: a message sent between the
    two (someone opens a DM with the bot and types at once) was meant for it.
    A join without an invite before it (a public room) cuts at the join.
    """
    start = 0
    invited = False
    for index, event in enumerate(events):
        change = own_membership(event, user_id)
        if change is None:
            continue
        membership, previous = change
        if membership == "invite" and previous not in ("invite", "join"):
            start, invited = index + 1, True
        elif membership == "join" and previous not in ("join", "invite") and not invited:
            start = index + 1
        elif membership in ("leave", "ban"):
            invited = False
    return start


def to_typing(room_id: str, event: TypingNoticeEvent) -> Typing:
    """Who types in the room now, as an ``m.typing`` event says."""
    return Typing(RoomKey(TRANSPORT, RoomId(room_id)), frozenset(UserId(u) for u in event.users))

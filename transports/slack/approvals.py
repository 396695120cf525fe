"""Approval requests as Block Kit messages, and their button clicks as approval actions.

A request is a ``section`` with the request's text (rendered and escaped as
every reply is, see :mod:`.mrkdwn`, and marked ``verbatim`` so Slack
links no ``@here`` or ``#channel`` in it) and an ``actions`` block with one
button per :class:`~bridge.core.transport.ApprovalChoice`; each button's
``action_id`` names the choice and its ``value`` is the approval's ref. A
click comes back as a ``block_actions`` interaction (over Socket Mode or the
events endpoint); :func:`to_action` reads it. Pure functions, tested without a peer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.core.model import ExternalMessageId, RoomId, RoomKey, UserId
from bridge.core.transport import ApprovalAction, ApprovalChoice
from transports.slack.inbound import SLACK
from transports.slack.mrkdwn import to_mrkdwn
from transports.text import split_markdown

ACTION_PREFIX = "chatbridge_approval_"
"""Every approval button's ``action_id`` starts so; the rest is the choice."""
BUTTONS: tuple[tuple[ApprovalChoice, str, str | None], ...] = (
    (ApprovalChoice.ALLOW, "Allow once", "primary"),
    (ApprovalChoice.ALLOW_SESSION, "Allow for this session", None),
    (ApprovalChoice.DENY, "Deny", "danger"),
)
SECTION_LIMIT = 3000
"""Slack's limit for a section's text (a longer one makes the whole post fail)."""
VALUE_LIMIT = 2000
"""Slack's limit for a button's value."""
_CUT = "\n…"
_MIN_PIECE = 40
"""No piece is cut below this; five-fold escaping of it still fits (as in :mod:`.outbound`)."""


def approval_fits(markdown: str, limit: int = SECTION_LIMIT) -> bool:
    """Whether ``markdown`` fits one section once rendered and escaped as it is sent."""
    return len(to_mrkdwn(markdown)) <= limit


def fitted(markdown: str, limit: int = SECTION_LIMIT) -> str:
    """``markdown`` rendered as mrkdwn, cut (marked ``…``) so that it fits ``limit``.

    A request whose text does not fit (:func:`approval_fits`) is posted
    shortened by the bridge, the whole in a file before it; this cut is only a
    safety net for an outcome's edit, whose text is the bridge's own.
    """
    rendered = to_mrkdwn(markdown)
    if len(rendered) <= limit:
        return rendered
    room = limit - len(_CUT)
    piece = markdown
    while len(rendered) > room and len(piece) > _MIN_PIECE:
        # Escaping grows text: shrink by the growth measured, at least by one.
        size = max(_MIN_PIECE, min(len(piece) - 1, len(piece) * room // len(rendered)))
        chunks = split_markdown(piece, size)
        if not chunks:
            break
        piece = chunks[0]
        rendered = to_mrkdwn(piece)
    # A piece of _MIN_PIECE characters fits whatever its escaping: the cut is a safety net.
    return rendered[:room] + _CUT


def _section(mrkdwn: str) -> dict[str, Any]:
    # verbatim: Slack must not turn "@here" or "#general" in the text into a
    # broadcast or a link (what parse=none does for a message's text).
    return {"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn, "verbatim": True}}


def request_blocks(mrkdwn: str, ref: str) -> list[dict[str, Any]]:
    """The blocks of an approval request: its text, and the three buttons carrying ``ref``."""
    buttons: list[dict[str, Any]] = []
    for choice, label, style in BUTTONS:
        button: dict[str, Any] = {
            "type": "button",
            "action_id": ACTION_PREFIX + choice.value,
            "text": {"type": "plain_text", "text": label},
            "value": ref[:VALUE_LIMIT],
        }
        if style:
            button["style"] = style
        buttons.append(button)
    return [
        _section(mrkdwn),
        {"type": "actions", "block_id": "chatbridge_approval", "elements": buttons},
    ]


def closed_blocks(mrkdwn: str) -> list[dict[str, Any]]:
    """The blocks of a decided request: its outcome only (the buttons go)."""
    return [_section(mrkdwn)]


def to_action(
    payload: Mapping[str, Any], bot_user_id: str, rooms: frozenset[str]
) -> ApprovalAction | None:
    """The approval action a ``block_actions`` interaction carries, or None.

    None for other interactions, clicks in rooms not configured, clicks of
    the bot itself, buttons that are not the bridge's approval buttons, and
    payloads without the clicking user or the message.
    """
    if payload.get("type") != "block_actions":
        return None
    user = payload.get("user")
    user_id = user.get("id") if isinstance(user, Mapping) else None
    if not isinstance(user_id, str) or user_id == bot_user_id:
        return None
    if isinstance(user, Mapping) and user.get("is_bot") is True:
        return None
    container = payload.get("container")
    container = container if isinstance(container, Mapping) else {}
    channel = payload.get("channel")
    channel_id = channel.get("id") if isinstance(channel, Mapping) else None
    channel_id = channel_id or container.get("channel_id")
    if not isinstance(channel_id, str) or channel_id not in rooms:
        return None
    message = payload.get("message")
    ts = container.get("message_ts") or (
        message.get("ts") if isinstance(message, Mapping) else None
    )
    if not isinstance(ts, str):
        return None
    # The thread the request is in (not its own, should it have replies): an answer to
    # the click goes there, where the person is looking.
    thread = container.get("thread_ts") or (
        message.get("thread_ts") if isinstance(message, Mapping) else None
    )
    thread = thread if isinstance(thread, str) and thread != ts else ""
    for action in payload.get("actions") or ():
        action_id = action.get("action_id") if isinstance(action, Mapping) else None
        if not isinstance(action_id, str) or not action_id.startswith(ACTION_PREFIX):
            continue
        try:
            choice = ApprovalChoice(action_id.removeprefix(ACTION_PREFIX))
        except ValueError:
            continue
        return ApprovalAction(
            RoomKey(SLACK, RoomId(channel_id), thread),
            UserId(user_id),
            ExternalMessageId(ts),
            choice,
        )
    return None

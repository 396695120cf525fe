"""Approval requests as Block Kit messages, and their button clicks as approval actions.

A request is a ``section`` with the request's text (rendered and escaped as
every reply is, see :mod:`.mrkdwn`, and marked ``verbatim`` so Slack
links no ``@here`` or ``#channel`` in it) and an ``actions`` block with one
button per :class:`~bridge.core.transport.ApprovalChoice`; each button's
``action_id`` names the choice and its ``value`` is the approval's ref. A plan
gets "Start, edits asked", "Start, edits accepted" and "Keep planning" (which
only says how to send feedback); a question of one choice a button per option,
others radio groups or checkboxes and an "Answer" button (docs/live-runs.md,
"Questions and plans"). A click comes back as a ``block_actions`` interaction
(over Socket Mode or the events endpoint); :func:`to_action` reads it.
Pure functions, tested without a peer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.core.model import ExternalMessageId, RoomId, RoomKey, UserId
from bridge.core.transport import TOOL_ASKED, ApprovalAction, ApprovalChoice, Asked, AskKind
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
OPTION = "option_"
"""A question's option button: ``option_2`` answers ``2``."""
SUBMIT = "submit"
"""The button that answers with the radio groups and checkboxes picked."""
KEEP_PLANNING = "keep_planning"
"""A plan's "Keep planning": decides nothing, says how to send feedback."""
PLAN_BUTTONS: tuple[tuple[str, str, str | None], ...] = (
    (ApprovalChoice.ALLOW.value, "Start, edits asked", "primary"),
    (ApprovalChoice.ALLOW_SESSION.value, "Start, edits accepted", None),
    (KEEP_PLANNING, "Keep planning", None),
)
PICK_PREFIX = "chatbridge_pick_"
"""A question's radio group or checkboxes (block and action id ``chatbridge_pick_2``);
picking only acknowledges, the submit button answers."""
LABEL_LIMIT = 75
"""Slack's limit for a button's or an option's text."""
BUTTONS_LIMIT = 25
"""Slack's limit of elements in an actions block."""
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


def _button(action: str, label: str, ref: str, style: str | None = None) -> dict[str, Any]:
    button: dict[str, Any] = {
        "type": "button",
        "action_id": ACTION_PREFIX + action,
        "text": {"type": "plain_text", "text": label[:LABEL_LIMIT]},
        "value": ref[:VALUE_LIMIT],
    }
    if style:
        button["style"] = style
    return button


def _option(number: int, label: str) -> dict[str, Any]:
    text = f"{number}. {label}"
    return {"text": {"type": "plain_text", "text": text[:LABEL_LIMIT]}, "value": str(number)}


def _question_blocks(asked: Asked, ref: str) -> list[dict[str, Any]]:
    """One question of one choice: a button per option (a click answers). Otherwise a
    radio group or checkboxes per question, and a submit button that answers them all."""
    if len(asked.questions) == 1 and not asked.questions[0].multi:
        options = asked.questions[0].options[:BUTTONS_LIMIT]
        buttons = [
            _button(f"{OPTION}{n}", f"{n}. {label}", ref) for n, label in enumerate(options, 1)
        ]
        return [{"type": "actions", "block_id": "chatbridge_approval", "elements": buttons}]
    blocks: list[dict[str, Any]] = []
    for index, question in enumerate(asked.questions, 1):
        element = {
            "type": "checkboxes" if question.multi else "radio_buttons",
            "action_id": f"{PICK_PREFIX}{index}",
            "options": [_option(n, label) for n, label in enumerate(question.options[:10], 1)],
        }
        blocks.append(
            {"type": "actions", "block_id": f"{PICK_PREFIX}{index}", "elements": [element]}
        )
    submit = _button(SUBMIT, "Answer", ref, "primary")
    blocks.append({"type": "actions", "block_id": "chatbridge_approval", "elements": [submit]})
    return blocks


def request_blocks(mrkdwn: str, ref: str, asked: Asked = TOOL_ASKED) -> list[dict[str, Any]]:
    """The blocks of a request: its text, and the actions that answer it, carrying ``ref``
    (a tool use: three buttons; a plan: three; a question: its options)."""
    if asked.kind is AskKind.QUESTION:
        return [_section(mrkdwn), *_question_blocks(asked, ref)]
    if asked.kind is AskKind.PLAN:
        buttons = [_button(action, label, ref, style) for action, label, style in PLAN_BUTTONS]
    else:
        buttons = [_button(choice.value, label, ref, style) for choice, label, style in BUTTONS]
    return [
        _section(mrkdwn),
        {"type": "actions", "block_id": "chatbridge_approval", "elements": buttons},
    ]


def _picked(payload: Mapping[str, Any]) -> str:
    """The answer the submitted radio groups and checkboxes hold, as ``!answer`` reads it
    (``1,3;2``; a question with nothing picked has an empty part)."""
    state = payload.get("state")
    values = state.get("values") if isinstance(state, Mapping) else None
    if not isinstance(values, Mapping):
        return ""
    parts: dict[int, str] = {}
    for block_id, block in values.items():
        if not isinstance(block_id, str) or not block_id.startswith(PICK_PREFIX):
            continue
        if not isinstance(block, Mapping):
            continue
        try:
            index = int(block_id.removeprefix(PICK_PREFIX))
        except ValueError:
            continue
        for element in block.values():
            if not isinstance(element, Mapping):
                continue
            chosen = element.get("selected_options")
            if chosen is None and isinstance(element.get("selected_option"), Mapping):
                chosen = [element["selected_option"]]
            numbers = [
                str(o.get("value"))
                for o in chosen or ()
                if isinstance(o, Mapping) and str(o.get("value")).isdigit()
            ]
            parts[index] = ",".join(numbers)
    if not parts:
        return ""
    return "; ".join(parts.get(i, "") for i in range(1, max(parts) + 1))


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
        room = RoomKey(SLACK, RoomId(channel_id), thread)
        name = action_id.removeprefix(ACTION_PREFIX)
        answer, guide = "", False
        if name.startswith(OPTION) and name.removeprefix(OPTION).isdigit():
            choice, answer = ApprovalChoice.ALLOW, name.removeprefix(OPTION)
        elif name == SUBMIT:
            choice, answer = ApprovalChoice.ALLOW, _picked(payload)
        elif name == KEEP_PLANNING:
            choice, guide = ApprovalChoice.DENY, True
        else:
            try:
                choice = ApprovalChoice(name)
            except ValueError:
                continue
        return ApprovalAction(
            room, UserId(user_id), ExternalMessageId(ts), choice, answer=answer, guide=guide
        )
    return None

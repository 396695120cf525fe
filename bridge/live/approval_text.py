"""The room's view of a tool-use request: what it will do, and how to answer.

Everything in a request comes from claude, which may be repeating hostile
text (a web page, a file). It is shown only inside code spans and fenced
blocks, whose delimiters are longer than any backtick run in it, so it
cannot end them and be rendered as Markdown; control and invisible
formatting characters (newlines in a one-line field, bidirectional
overrides, zero-width characters) are shown as escapes, so what is approved
reads as what runs. Pings are out of reach as well: the transports send
with no mentions (Matrix ``m.mentions``) and escape Slack's ``<...>``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from bridge.core.duration import format_duration
from bridge.core.text import visible
from bridge.store.base import Approval, ApprovalState

FIELD_LIMIT = 300
"""A path, URL or query."""

_BACKTICKS = re.compile(r"`+")


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def code_span(text: str, limit: int | None = FIELD_LIMIT) -> str:
    """``text`` as one inline code span that nothing in it can close (cut to ``limit``
    characters, saying so; None: whole)."""
    shown = visible(text) if limit is None else clip(visible(text), limit)
    longest = max((len(run) for run in _BACKTICKS.findall(shown)), default=0)
    ticks = "`" * (longest + 1)
    # CommonMark strips one space each side: padding keeps edge backticks apart.
    pad = " " if shown.startswith("`") or shown.endswith("`") or not shown.strip() else ""
    return f"{ticks}{pad}{shown}{pad}{ticks}"


def code_block(text: str, info: str = "") -> str:
    """``text`` as a fenced block that nothing in it can close."""
    body = visible(text, keep_newlines=True)
    longest = max((len(run) for run in _BACKTICKS.findall(body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{body}\n{fence}"


def parse_input(input_json: str) -> dict[str, Any]:
    """The tool input as stored; anything but a JSON object is shown as raw text."""
    try:
        value = json.loads(input_json)
    except ValueError:
        return {"input": input_json}
    return value if isinstance(value, dict) else {"input": value}


def request_text(approval: Approval, prefix: str, timeout_s: float, shown: str) -> str:
    """The message asking the room: the tool, ``shown`` (what it will do, as
    :mod:`bridge.live.tool_view` renders it), the ids, how to answer."""
    number = f"#{approval.number}"
    tool = code_span(approval.tool_name, 100)
    return "\n".join(
        [
            f"Claude asks to use {tool} (request `{number}`, run `{approval.run_id}`):",
            shown,
            f"Answer `{prefix}approve {number}`, `{prefix}approve session {number}`"
            f" (also later uses like it in this session) or `{prefix}deny {number} reason`."
            f" Unanswered, it is denied in {format_duration(timeout_s)}.",
        ]
    )


_OUTCOMES = {
    ApprovalState.PENDING: "waiting for an answer",
    ApprovalState.ALLOWED: "allowed",
    ApprovalState.ALLOWED_SESSION: "allowed for the session",
    ApprovalState.DENIED: "denied",
    ApprovalState.EXPIRED: "denied: nobody answered in time",
    ApprovalState.CANCELLED: "cancelled",
}


def outcome_text(approval: Approval) -> str:
    """One line on what became of a request (its message's edit, a command's answer)."""
    line = f"Request `#{approval.number}` ({code_span(approval.tool_name, 100)}):"
    line += f" {_OUTCOMES[approval.state]}"
    if approval.decided_by is not None:
        line += f" by {code_span(approval.decided_by, 100)}"
    if approval.state is ApprovalState.DENIED and approval.reason:
        line += f" ({code_span(approval.reason)})"
    elif approval.state is ApprovalState.CANCELLED:
        # The bridge's own words: the run ended (how), or claude withdrew it.
        line += f": {approval.reason or 'the run ended'}"
    return line + "."


def status_line(approval: Approval, now: float) -> str:
    """``#3 Bash, asked 2m05s ago``: a pending request in ``!status``."""
    age = format_duration(now - approval.asked_at)
    return f"- `#{approval.number}` {code_span(approval.tool_name, 100)}, asked {age} ago"

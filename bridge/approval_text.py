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

import difflib
import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from bridge.approvals import WITHDRAWN
from bridge.core.text import safe_text
from bridge.duration import format_duration
from bridge.store.base import Approval, ApprovalState

COMMAND_LIMIT = 1500
"""Characters of a Bash command shown; a longer one is cut, saying by how much."""
DIFF_LINES = 40
DIFF_LINE_LIMIT = 200
JSON_LIMIT = 800
FIELD_LIMIT = 300
"""A path, URL or query."""

_EDIT_TOOLS = frozenset({"Edit", "MultiEdit", "Write"})
_BACKTICKS = re.compile(r"`+")


def visible(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with what would not show (or would show misleadingly) escaped.

    Control characters and Unicode format characters (``Cf``: bidi
    overrides, zero-width joiners) become ``\\u{…}``; a newline stays only
    with ``keep_newlines`` (in a block), a tab stays.
    """
    out = []
    for char in safe_text(text):
        if (char == "\n" and keep_newlines) or char == "\t":
            out.append(char)
        elif unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(f"\\u{{{ord(char):04x}}}")
        else:
            out.append(char)
    return "".join(out)


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def code_span(text: str, limit: int = FIELD_LIMIT) -> str:
    """``text`` as one inline code span that nothing in it can close."""
    shown = clip(visible(text), limit)
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


def describe(tool_name: str, tool_input: Mapping[str, Any]) -> str:
    """What the tool use will do, as Markdown: the command, the change, the URL."""
    if tool_name == "Bash" and isinstance(tool_input.get("command"), str):
        return code_block(clip(tool_input["command"], COMMAND_LIMIT), "sh")
    path = tool_input.get("file_path")
    if tool_name in _EDIT_TOOLS and isinstance(path, str):
        return f"File {code_span(path)}:\n{code_block(edit_diff(tool_name, tool_input), 'diff')}"
    if tool_name == "WebFetch" and isinstance(tool_input.get("url"), str):
        return f"URL {code_span(tool_input['url'])}"
    if tool_name == "WebSearch" and isinstance(tool_input.get("query"), str):
        return f"Search for {code_span(tool_input['query'])}"
    compact = json.dumps(tool_input, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return code_block(clip(compact, JSON_LIMIT), "json")


def edit_diff(tool_name: str, tool_input: Mapping[str, Any]) -> str:
    """A short unified diff of an Edit, MultiEdit or Write (a new file's lines, for Write)."""
    pairs: list[tuple[str, str]] = []
    if tool_name == "Write":
        pairs.append(("", _text(tool_input.get("content"))))
    elif tool_name == "MultiEdit" and isinstance(tool_input.get("edits"), list):
        for edit in tool_input["edits"]:
            if isinstance(edit, Mapping):
                pairs.append((_text(edit.get("old_string")), _text(edit.get("new_string"))))
    else:
        pairs.append((_text(tool_input.get("old_string")), _text(tool_input.get("new_string"))))
    lines: list[str] = []
    for old, new in pairs:
        diff = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=2)
        # The ---/+++ header names no file here (it is shown above the block).
        lines += [line for line in diff if not line.startswith(("---", "+++"))]
    shown = [clip(line, DIFF_LINE_LIMIT) for line in lines[:DIFF_LINES]]
    if len(lines) > DIFF_LINES:
        shown.append(f"… ({len(lines) - DIFF_LINES} more lines)")
    return "\n".join(shown) if shown else "(no change)"


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def parse_input(input_json: str) -> dict[str, Any]:
    """The tool input as stored; anything but a JSON object is shown as raw text."""
    try:
        value = json.loads(input_json)
    except ValueError:
        return {"input": input_json}
    return value if isinstance(value, dict) else {"input": value}


def request_text(approval: Approval, prefix: str, timeout_s: float) -> str:
    """The message asking the room: the tool, what it will do, the ids, how to answer."""
    number = f"#{approval.number}"
    tool = code_span(approval.tool_name, 100)
    return "\n".join(
        [
            f"Claude asks to use {tool} (request `{number}`, run `{approval.run_id}`):",
            describe(approval.tool_name, parse_input(approval.input_json)),
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
    ApprovalState.CANCELLED: "cancelled: the run ended",
}


def outcome_text(approval: Approval) -> str:
    """One line on what became of a request (its message's edit, a command's answer)."""
    line = f"Request `#{approval.number}` ({code_span(approval.tool_name, 100)}):"
    if approval.state is ApprovalState.CANCELLED and approval.reason == WITHDRAWN:
        line += f" cancelled: {WITHDRAWN}"
    else:
        line += f" {_OUTCOMES[approval.state]}"
    if approval.decided_by is not None:
        line += f" by {code_span(approval.decided_by, 100)}"
    if approval.state is ApprovalState.DENIED and approval.reason:
        line += f" ({code_span(approval.reason)})"
    return line + "."


def status_line(approval: Approval, now: float) -> str:
    """``#3 Bash, asked 2m05s ago``: a pending request in ``!status``."""
    age = format_duration(now - approval.asked_at)
    return f"- `#{approval.number}` {code_span(approval.tool_name, 100)}, asked {age} ago"

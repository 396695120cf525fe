"""NDJSON framing and decoding of claude's stream-json output. Pure: no I/O.

``LineFramer`` cuts a byte stream into lines with a cap on a line's length
(asyncio's ``readline`` stops at 64 KiB, and a tool result holding a whole
file can be many MB). ``parse_line`` turns one line into typed events,
ignoring types and subtypes it does not know, as the CLI adds new ones.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from bridge.core.model import SessionId
from runner.errors import LineTooLong, MalformedLine
from runner.events import (
    ApiRetry,
    AssistantText,
    ControlAnswer,
    Init,
    MessageTaken,
    PermissionAsked,
    PermissionCancelled,
    Result,
    StreamEvent,
    ToolResult,
    ToolUse,
    UsageLimited,
)


class LineFramer:
    """Splits chunks into newline-terminated lines of at most ``max_line_bytes``.

    The cap counts the line's bytes without its newline. A line longer than
    the cap raises :class:`LineTooLong` as soon as that is known, so memory
    stays bounded by about one cap plus one chunk.
    """

    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add ``chunk``; return the lines it completed, newline stripped."""
        return [line for line, _ in self.feed_ends(chunk)]

    def feed_ends(self, chunk: bytes) -> list[tuple[bytes, int]]:
        """Like :meth:`feed`, each line with where it ends in ``chunk`` (just past its newline)."""
        lines: list[tuple[bytes, int]] = []
        start = 0
        # Only the new chunk needs searching: the buffer holds no newline.
        while (nl := chunk.find(b"\n", start)) != -1:
            piece = chunk[start:nl]
            if len(self._buf) + len(piece) > self._max:
                raise LineTooLong(self._max)
            if self._buf:
                self._buf += piece
                lines.append((bytes(self._buf), nl + 1))
                self._buf.clear()
            else:
                lines.append((piece, nl + 1))
            start = nl + 1
        rest = chunk[start:]
        if len(self._buf) + len(rest) > self._max:
            raise LineTooLong(self._max)
        self._buf += rest
        return lines

    def finish(self) -> bytes | None:
        """At end of stream: the last line if it had no newline, else None."""
        if not self._buf:
            return None
        last = bytes(self._buf)
        self._buf.clear()
        return last


def parse_line(line: bytes) -> list[StreamEvent]:
    """Decode one stream-json line into zero or more events.

    Blank lines and unknown ``type``/``subtype`` values give no event; a line
    that is not a JSON object raises :class:`MalformedLine`.
    """
    if not line.strip():
        return []
    try:
        obj = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedLine("not JSON", line) from exc
    if not isinstance(obj, dict):
        raise MalformedLine("not a JSON object", line)
    match obj.get("type"):
        case "system" if obj.get("subtype") == "init":
            return [_init(obj)]
        case "system" if obj.get("subtype") == "api_retry":
            return [_api_retry(obj)]
        case "rate_limit_event":
            return _rate_limit(obj)
        case "assistant":
            return _assistant(obj)
        case "user" if obj.get("isReplay") is True:
            uid = _str(obj.get("uuid"))
            return [MessageTaken(uid)] if uid else []
        case "user":
            return _tool_results(obj)
        case "result":
            return [_result(obj)]
        case "control_request":
            return _control_request(obj)
        case "control_response":
            return _control_response(obj)
        case "control_cancel_request" if _str(obj.get("request_id")):
            return [PermissionCancelled(_str(obj.get("request_id")))]
        case _:
            return []


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _int(value: object) -> int | None:
    # bool is an int subclass; a true/false here is not a count.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _amount(value: object) -> float | None:
    """A cost in USD: a finite number, not below 0. A misbehaving claude's NaN,
    infinity or negative cost is no amount: summed into a day's spending it would
    hide or poison the budget, and a Prometheus counter refuses a negative one."""
    amount = _float(value)
    return amount if amount is not None and math.isfinite(amount) and amount >= 0 else None


LAST_DATE_S = 253402300799.0
"""9999-12-31 23:59:59 UTC: the last second a ``datetime`` (and the room) can be told."""


def _epoch(value: object) -> float | None:
    """A time in seconds since the epoch that is a date (after 1970, by year 9999);
    else None. A reset time in milliseconds, say, would be ``year 58873``."""
    at = _float(value)
    return at if at is not None and 0 < at <= LAST_DATE_S else None


def _session(value: object) -> SessionId | None:
    return SessionId(value) if isinstance(value, str) and value else None


def _blocks(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    message = obj.get("message")
    if not isinstance(message, dict):
        return []
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict)]


def _init(obj: Mapping[str, Any]) -> Init:
    tools = obj.get("tools")
    return Init(
        session_id=SessionId(_str(obj.get("session_id"))),
        model=_str(obj.get("model")),
        cwd=_str(obj.get("cwd")),
        tools=tuple(t for t in tools if isinstance(t, str)) if isinstance(tools, list) else (),
    )


def _rate_limit(obj: Mapping[str, Any]) -> list[StreamEvent]:
    """Only a rejection matters (``allowed`` and ``allowed_warning`` change nothing):
    the Agent SDK's ``RateLimitInfo``, observed from claude 2.1.332 on a 429 with
    the unified rate-limit headers."""
    info = obj.get("rate_limit_info")
    if not isinstance(info, dict) or info.get("status") != "rejected":
        return []
    return [UsageLimited(_epoch(info.get("resetsAt")), _str(info.get("rateLimitType")))]


def _api_retry(obj: Mapping[str, Any]) -> ApiRetry:
    # Field names as in the Agent SDK's SDKAPIRetryMessage.
    return ApiRetry(
        attempt=_int(obj.get("attempt")),
        max_retries=_int(obj.get("max_retries")),
        retry_delay_ms=_int(obj.get("retry_delay_ms")),
        error_status=_int(obj.get("error_status")),
        error=_str(obj.get("error")),
    )


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _control_request(obj: Mapping[str, Any]) -> list[StreamEvent]:
    """claude asks its host; only ``can_use_tool`` is the bridge's to answer (no hooks
    are configured; ``mcp_message``, for the run's SDK MCP server, is the supervisor's:
    docs/files.md), other subtypes are ignored."""
    request = _dict(obj.get("request"))
    request_id = _str(obj.get("request_id"))
    if request.get("subtype") != "can_use_tool" or not request_id:
        return []
    suggestions = request.get("permission_suggestions")
    return [
        PermissionAsked(
            request_id=request_id,
            tool_name=_str(request.get("tool_name")),
            input=_dict(request.get("input")),
            tool_use_id=_str(request.get("tool_use_id")),
            description=_str(request.get("description")),
            suggestions=tuple(s for s in suggestions if isinstance(s, dict))
            if isinstance(suggestions, list)
            else (),
            requires_user_interaction=request.get("requires_user_interaction") is True,
        )
    ]


def _control_response(obj: Mapping[str, Any]) -> list[StreamEvent]:
    response = _dict(obj.get("response"))
    request_id = _str(response.get("request_id"))
    if not request_id:
        return []
    return [
        ControlAnswer(
            request_id=request_id,
            ok=response.get("subtype") == "success",
            response=_dict(response.get("response")),
            error=_str(response.get("error")),
        )
    ]


def _assistant(obj: Mapping[str, Any]) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    for block in _blocks(obj):
        match block.get("type"):
            case "text":
                events.append(AssistantText(_str(block.get("text"))))
            case "tool_use":
                tool_input = block.get("input")
                events.append(
                    ToolUse(
                        id=_str(block.get("id")),
                        name=_str(block.get("name")),
                        input=tool_input if isinstance(tool_input, dict) else {},
                    )
                )
            case _:
                pass  # thinking and future block types are not shown
    return events


def _tool_results(obj: Mapping[str, Any]) -> list[StreamEvent]:
    return [
        ToolResult(
            tool_use_id=_str(block.get("tool_use_id")),
            content=_flatten(block.get("content")),
            is_error=block.get("is_error") is True,
        )
        for block in _blocks(obj)
        if block.get("type") == "tool_result"
    ]


def _flatten(content: object) -> str:
    """A tool result's content is a string or a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            _str(b.get("text")) for b in content if isinstance(b, dict) and b.get("type") == "text"
        ]
        return "\n".join(texts)
    return ""


def _result(obj: Mapping[str, Any]) -> Result:
    errors = obj.get("errors")
    return Result(
        subtype=_str(obj.get("subtype")),
        is_error=obj.get("is_error") is True,
        text=_str(obj.get("result")),
        session_id=_session(obj.get("session_id")),
        cost_usd=_amount(obj.get("total_cost_usd")),
        num_turns=_int(obj.get("num_turns")),
        duration_ms=_int(obj.get("duration_ms")),
        errors=tuple(e if isinstance(e, str) else json.dumps(e) for e in errors)
        if isinstance(errors, list)
        else (),
        terminal_reason=_str(obj.get("terminal_reason")),
    )

"""Typed events of one run, decoded from claude's stream-json output.

Only what the service shows or records is kept; everything else in a line
(usage, ids of API messages, permission denials...) is dropped at this edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridge.core.model import LiveRun, SessionId


@dataclass(frozen=True, slots=True)
class Spawned:
    """The claude process started (or, re-attached, runs); ``pid`` is its process id.

    ``live`` says where its supervisor is reached: what the bridge keeps to
    attach again after a restart.
    """

    pid: int
    live: LiveRun


@dataclass(frozen=True, slots=True)
class Init:
    """The ``system/init`` line: the session the run writes to."""

    session_id: SessionId
    model: str
    cwd: str
    tools: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AssistantText:
    """A text block the model wrote."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The model asked to run a tool."""

    id: str
    name: str
    input: dict[str, Any] = field(hash=False)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's answer, flattened to text."""

    tool_use_id: str
    content: str
    is_error: bool


@dataclass(frozen=True, slots=True)
class Result:
    """The last line of a run: how claude itself saw the outcome."""

    subtype: str
    is_error: bool
    text: str
    session_id: SessionId | None
    cost_usd: float | None
    num_turns: int | None
    duration_ms: int | None
    errors: tuple[str, ...]
    terminal_reason: str = ""
    """Why the turn ended: ``completed``, ``aborted_tools`` / ``aborted_streaming``
    (an interrupt)...; empty when claude did not say."""


AUTH_STATUSES = frozenset({401, 403})
"""HTTP statuses no retry can fix: the key or login was refused."""


@dataclass(frozen=True, slots=True)
class ApiRetry:
    """A ``system/api_retry`` line: claude's API request failed and it will try again.

    ``error_status`` is the HTTP status (None when no response came, e.g. a
    connection error); ``error`` is claude's category of it
    (``authentication_failed``, ``rate_limit``, ``overloaded``, ``server_error``...).
    """

    attempt: int | None
    max_retries: int | None
    retry_delay_ms: int | None
    error_status: int | None
    error: str

    @property
    def auth_failed(self) -> bool:
        """Retrying cannot help: claude's credentials were refused (401/403)."""
        return self.error_status in AUTH_STATUSES or self.error == "authentication_failed"

    def describe(self) -> str:
        status = f"HTTP {self.error_status}" if self.error_status is not None else "no response"
        return f"{status}, {self.error}" if self.error else status


@dataclass(frozen=True, slots=True)
class UsageLimited:
    """A ``rate_limit_event`` whose status is ``rejected``: the account's usage limit
    (``limit``: ``five_hour``, ``seven_day``...) is reached and the turn ends with an
    error result. ``resets_at``: when it resets (seconds since the epoch), if claude said.
    """

    resets_at: float | None
    limit: str


@dataclass(frozen=True, slots=True)
class PermissionAsked:
    """claude asks before a tool use its rules do not decide (``can_use_tool``, with
    ``RunRequest.approve_tools``); it waits for ``RunControl.answer(request_id, ...)``."""

    request_id: str
    tool_name: str
    input: dict[str, Any] = field(hash=False)
    tool_use_id: str
    description: str
    suggestions: tuple[dict[str, Any], ...] = field(hash=False)
    """claude's ``permission_suggestions``: what an "allow for this session" would add."""
    requires_user_interaction: bool = False
    """claude marks the tool as one only its own user interface can answer."""


@dataclass(frozen=True, slots=True)
class PermissionCancelled:
    """claude no longer waits on permission request ``request_id`` (an interrupt
    withdrew it: ``control_cancel_request``); an answer to it is not sent."""

    request_id: str


@dataclass(frozen=True, slots=True)
class MessageTaken:
    """claude took the user message ``uuid`` into the conversation (its echo)."""

    uuid: str


@dataclass(frozen=True, slots=True)
class JournalUnwritable:
    """The run's journal cannot be written (``error``: a full disk, most often): the
    supervisor holds what claude writes in memory, bounded, and writes it once it can.
    The run goes on; an attached bridge still gets every line."""

    error: str


@dataclass(frozen=True, slots=True)
class JournalWritable:
    """The journal is written again: the ``held_bytes`` held back are in it now."""

    held_bytes: int


@dataclass(frozen=True, slots=True)
class ControlAnswer:
    """claude's ``control_response`` to a control request (ours, or echoed: the runner
    matches ``request_id``). Not handed to ``on_event``."""

    request_id: str
    ok: bool
    response: dict[str, Any] = field(hash=False)
    error: str


RunEvent = (
    Spawned
    | Init
    | AssistantText
    | ToolUse
    | ToolResult
    | ApiRetry
    | UsageLimited
    | Result
    | PermissionAsked
    | PermissionCancelled
    | MessageTaken
    | JournalUnwritable
    | JournalWritable
)
"""Everything ``run_claude`` hands to its ``on_event`` callback."""

StreamEvent = RunEvent | ControlAnswer
"""What a stdout line decodes to."""

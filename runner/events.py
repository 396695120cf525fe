"""Typed events of one run, decoded from claude's stream-json output.

Only what the service shows or records is kept; everything else in a line
(usage, ids of API messages, permission denials...) is dropped at this edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridge.core.model import SessionId


@dataclass(frozen=True, slots=True)
class Spawned:
    """The claude process started; ``pid`` is its process id."""

    pid: int


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


RunEvent = Spawned | Init | AssistantText | ToolUse | ToolResult | Result
"""Everything ``run_claude`` hands to its ``on_event`` callback."""

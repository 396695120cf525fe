"""Runs ``claude -p`` for one batch and leaves no process of the run behind.

Imports only core types from ``bridge.core.model``. Entry points: :func:`run_claude`
for a run, :func:`kill_marked` for sweeping runs a crash left behind.
"""

from runner.command import MARKER_ENV, build_argv, build_env
from runner.errors import InvalidRequest, LineTooLong, MalformedLine, RunnerError, StreamError
from runner.events import (
    AssistantText,
    Init,
    Result,
    RunEvent,
    Spawned,
    ToolResult,
    ToolUse,
)
from runner.process import find_marked, kill_marked
from runner.request import RunRequest
from runner.run import EventCallback, run_claude

__all__ = [
    "MARKER_ENV",
    "AssistantText",
    "EventCallback",
    "Init",
    "InvalidRequest",
    "LineTooLong",
    "MalformedLine",
    "Result",
    "RunEvent",
    "RunRequest",
    "RunnerError",
    "Spawned",
    "StreamError",
    "ToolResult",
    "ToolUse",
    "build_argv",
    "build_env",
    "find_marked",
    "kill_marked",
    "run_claude",
]

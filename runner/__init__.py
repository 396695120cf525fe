"""Runs ``claude -p`` for one batch and leaves no process of the run behind.

Imports only core types from ``bridge.core.model``. Entry points: :func:`run_claude`
for a run, :func:`recover_run` for stopping what a crash left of a run.
"""

from runner.command import MARKER_ENV, build_argv, build_env
from runner.errors import InvalidRequest, LineTooLong, MalformedLine, RunnerError, StreamError
from runner.events import (
    ApiRetry,
    AssistantText,
    Init,
    Result,
    RunEvent,
    Spawned,
    ToolResult,
    ToolUse,
)
from runner.process import find_marked, kill_marked
from runner.recovery import recover_run
from runner.request import RunRequest
from runner.run import EventCallback, answer_report, run_claude

__all__ = [
    "MARKER_ENV",
    "ApiRetry",
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
    "answer_report",
    "build_argv",
    "build_env",
    "find_marked",
    "kill_marked",
    "recover_run",
    "run_claude",
]

"""Runs ``claude -p`` for one batch and leaves no process of the run behind.

Imports only core types from ``bridge.core``. Entry points: :func:`run_claude`
for a run (with a :class:`RunControl` to talk to it while it runs, and a
:func:`prestart` to have claude started before its prompt is known),
:func:`attach_claude` to follow again a run a previous bridge started (runs
outlive the bridge: docs/detached-runs.md),
:func:`remove_run_dir` once a run's outcome is recorded, and at start-up
:func:`clean_stray_runs` and :func:`recover_run` for runs no bridge will
follow again. :mod:`runner.mcp_server` is the ``chatbridge`` MCP server a run's
claude starts itself (``RunRequest.send_file_max_bytes``; run by file path,
never imported by claude's side).
"""

from runner.command import MARKER_ENV, build_argv, build_env
from runner.control import (
    Allow,
    ControlError,
    Decision,
    Deny,
    InputClosed,
    MessageTooLong,
    RunControl,
)
from runner.errors import InvalidRequest, LineTooLong, MalformedLine, RunnerError, StreamError
from runner.events import (
    ApiRetry,
    AssistantText,
    Init,
    JournalUnwritable,
    JournalWritable,
    MessageTaken,
    PermissionAsked,
    PermissionCancelled,
    Result,
    RunEvent,
    Spawned,
    ToolResult,
    ToolUse,
    UsageLimited,
)
from runner.prestart import Prestarted, prestart
from runner.process import find_marked, kill_marked
from runner.recovery import clean_stray_runs, recover_run
from runner.request import PromptImage, RunRequest
from runner.run import EventCallback, PositionCallback, answer_report, attach_claude, run_claude
from runner.rundir import (
    journal_exists,
    prepare_state_dir,
    remove_run_dir,
    run_dir_made,
    stray_runs,
)
from runner.spare import Spares

__all__ = [
    "MARKER_ENV",
    "Allow",
    "ApiRetry",
    "AssistantText",
    "ControlError",
    "Decision",
    "Deny",
    "EventCallback",
    "Init",
    "InputClosed",
    "InvalidRequest",
    "JournalUnwritable",
    "JournalWritable",
    "LineTooLong",
    "MalformedLine",
    "MessageTaken",
    "MessageTooLong",
    "PermissionAsked",
    "PermissionCancelled",
    "PositionCallback",
    "Prestarted",
    "PromptImage",
    "Result",
    "RunControl",
    "RunEvent",
    "RunRequest",
    "RunnerError",
    "Spares",
    "Spawned",
    "StreamError",
    "ToolResult",
    "ToolUse",
    "UsageLimited",
    "answer_report",
    "attach_claude",
    "build_argv",
    "build_env",
    "clean_stray_runs",
    "find_marked",
    "journal_exists",
    "kill_marked",
    "prepare_state_dir",
    "prestart",
    "recover_run",
    "remove_run_dir",
    "run_claude",
    "run_dir_made",
    "stray_runs",
]

"""Errors of the runner package.

``RunnerError`` is the root. ``run_claude`` itself does not raise these for a
run that went wrong: it folds them into a failed ``RunReport``; they surface
from the pure helpers (framing, argv building) so those can be tested alone.

    RunnerError
    ├── StreamError          stdout of claude is not valid stream-json
    │   ├── LineTooLong      a line exceeded the configured cap
    │   └── MalformedLine    a line is not a JSON object
    └── InvalidRequest       a RunRequest that cannot be turned into argv safely
"""

from __future__ import annotations


class RunnerError(Exception):
    """Root of the runner's errors."""


class StreamError(RunnerError):
    """claude's stdout could not be framed or decoded."""


class LineTooLong(StreamError):
    """A stdout line grew beyond the cap before its newline arrived."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"output line longer than {limit} bytes")
        self.limit = limit


class MalformedLine(StreamError):
    """A stdout line is not a JSON object."""

    def __init__(self, reason: str, line: bytes) -> None:
        preview = line[:120].decode("utf-8", "replace")
        super().__init__(f"malformed output line ({reason}): {preview!r}")
        self.reason = reason
        self.preview = preview


class InvalidRequest(RunnerError):
    """A request field would make the command line ambiguous."""

"""What one run of ``claude -p`` needs: the request the service builds per batch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bridge.core.model import RunId, SessionId


@dataclass(frozen=True)
class PromptImage:
    """An image sent with the prompt, as a base64 image content block claude can see."""

    media_type: str
    """``image/png``, ``image/jpeg``, ``image/gif`` or ``image/webp``."""
    data: str
    """The image's bytes, base64-encoded."""


@dataclass(frozen=True)
class RunRequest:
    """One batch's run of claude; see ``runner.command`` for how fields map to argv."""

    run_id: RunId
    """Also the marker value put into the environment of every process of the run."""
    claude_bin: str
    """A name looked up on PATH, or a path."""
    cwd: Path
    prompt: str
    """The first user message on stdin; never in argv, never through a shell."""
    images: tuple[PromptImage, ...] = field(default=(), kw_only=True)
    """Sent with the prompt, in its user message, after its text."""
    session_id: SessionId | None
    """Passed as ``--resume=<id>``; None starts a new session."""
    fork_session: bool = False
    """With a ``session_id``: continue a copy of it under a new id (``--fork-session``),
    leaving the resumed session as it was."""
    model: str = ""
    permission_mode: str = ""
    allowed_tools: tuple[str, ...] = ()
    disallowed_tools: tuple[str, ...] = ()
    append_system_prompt: str = ""
    max_turns: int = 0
    """0 leaves claude's default."""
    max_budget_usd: float | None = None
    """Passed as ``--max-budget-usd``; None leaves claude uncapped."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment, on top of the service's own minus ``CLAUDECODE``."""
    extra_args: tuple[str, ...] = ()
    send_file_max_bytes: int | None = None
    """Give the run the ``chatbridge`` MCP server (``send_file``, :mod:`runner.mcp_server`),
    refusing files over this size; None: no MCP server of ours."""
    approve_tools: bool = False
    """Ask the run's host before a tool use claude's rules do not decide
    (``--permission-prompt-tool stdio``: ``PermissionAsked`` events)."""
    run_timeout_s: float = 1800
    idle_timeout_s: float = 600
    """No stdout output for this long: the run is stalled."""
    stop_grace_s: float = 5.0
    """Time between SIGTERM and SIGKILL."""
    max_line_bytes: int = 16 * 1024 * 1024
    cgroup_parent: str = ""
    """A cgroup v2 directory to create the run's own group in; empty: no cgroup."""
    memory_max: int | None = None
    """The run's ``memory.max`` in bytes (needs ``cgroup_parent``)."""
    pids_max: int | None = None
    """The run's ``pids.max`` (needs ``cgroup_parent``)."""
    state_dir: Path | None = None
    """Where the run's directory goes (``<state_dir>/runs/<run_id>``, docs/detached-runs.md);
    None: a fresh temporary directory, removed after the run (for tests)."""
    orphan_timeout_s: float = 600.0
    """No bridge attached to the run for this long: its supervisor stops it."""
    spool_max_bytes: int = 64 * 1024 * 1024
    """The journal's cap: beyond it only ``result`` lines and the end of stderr are kept."""

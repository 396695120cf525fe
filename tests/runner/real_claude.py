"""Requests for the real claude CLI and waits on its processes."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge.core.model import RunId
from runner import RunRequest
from tests.fakes.model_server import ModelServer, claude_bin, claude_env
from tests.runner.conftest import pids_with_marker


def real_request(
    run_id: RunId, tmp_path: Path, server: ModelServer, prompt: str, **overrides: Any
) -> RunRequest:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    fields: dict[str, Any] = {
        "run_id": run_id,
        "claude_bin": str(claude_bin()),
        "cwd": work,
        "prompt": prompt,
        "session_id": None,
        "permission_mode": "bypassPermissions",
        "allowed_tools": ("Bash",),
        "env": claude_env(server.url, tmp_path / "home"),
        "run_timeout_s": 90,
        "idle_timeout_s": 90,
        "stop_grace_s": 2.0,
    }
    fields.update(overrides)
    return RunRequest(**fields)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


async def until(condition: Callable[[], bool], within: float = 60.0) -> None:
    """Poll a condition about other processes (nothing to await on for those)."""
    async with asyncio.timeout(within):
        while not condition():
            await asyncio.sleep(0.05)


def marked_with(run_id: RunId, command: str) -> list[int]:
    return [pid for pid in pids_with_marker(run_id) if cmdline(pid) == command]


async def chatbridge_console(config: Path, stdin: bytes) -> tuple[int | None, str, str]:
    """``chatbridge run`` (console) in ``config``'s directory, fed ``stdin`` to its end:
    its exit code, stdout and log. No ``CHATBRIDGE_`` variable of ours reaches it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge", "run", "--config", str(config),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=config.parent,
        env={k: v for k, v in os.environ.items() if not k.startswith("CHATBRIDGE_")},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(stdin), timeout=120)
    return process.returncode, out.decode(), err.decode()

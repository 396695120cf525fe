"""``chatbridge run`` as a subprocess, for the transports' end-to-end tests."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.fake_claude import FAKE_CLAUDE, install

CHATBRIDGE = Path(sys.executable).parent / "chatbridge"
READY_LINE = "chatbridge ready"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


def require_service() -> None:
    """Skip (fail under CI) when the service or the fake claude is missing."""
    problem = None
    if not CHATBRIDGE.is_file():
        problem = f"no chatbridge entry point at {CHATBRIDGE}"
    elif not FAKE_CLAUDE.is_file():
        problem = f"no fake claude at {FAKE_CLAUDE}"
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(problem)
    pytest.skip(problem)


def base_config(tmp: Path) -> dict[str, Any]:
    """The configuration every end-to-end test shares: fake claude, SQLite in ``tmp``, no console.

    Tests lay their transport's tables over it (``tests.config_files.merged``).
    """
    # Through a launcher that names this interpreter: the script's own
    # ``env python3`` may be a slow shim (pyenv), whose start-up the ping
    # benchmarks would otherwise count as chatbridge's.
    launchers = tmp / "bin"
    launchers.mkdir(exist_ok=True)
    return {
        # "stop": a test's service that ends during a run leaves no run behind
        # (the tests of detached runs kill the service instead).
        "runner": {
            "claude_bin": install(launchers),
            "stop_grace_s": 1,
            "state_dir": tmp / "state",
            "on_shutdown": "stop",
        },
        "dispatcher": {"coalesce_ms": 300},
        "database": {"url": f"sqlite+aiosqlite:///{tmp / 'chatbridge.db'}"},
        "console": {"enabled": False},
        "http": {"listen": ""},
        "defaults": {"cwd": tmp},
    }


@dataclass
class RunningService:
    process: asyncio.subprocess.Process
    log: list[str] = field(default_factory=list)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log[-lines:])


@asynccontextmanager
async def run_service(
    config: Path, env: Mapping[str, str], secrets: tuple[str, ...] = (), *, stdin: bool = False
) -> AsyncIterator[RunningService]:
    """Start ``chatbridge run``, wait for its ready line, stop it (SIGTERM, then KILL) on exit.

    ``env`` is added to this process's environment; none of ``secrets`` may
    appear in the service's log. ``stdin``: a pipe (the console room's input) in
    place of none.
    """
    require_service()
    process = await asyncio.create_subprocess_exec(
        str(CHATBRIDGE), "run", "--config", str(config),
        env={**os.environ, **env},
        cwd=config.parent,
        stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    running = RunningService(process)
    ready = asyncio.Event()

    async def read_log() -> None:
        assert process.stderr is not None
        async for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip()
            running.log.append(line)
            if READY_LINE in line:
                ready.set()

    async with asyncio.TaskGroup() as tasks:
        reader = tasks.create_task(read_log())
        try:
            waiter = tasks.create_task(ready.wait())
            await asyncio.wait(
                {waiter, reader}, timeout=START_TIMEOUT_S, return_when="FIRST_COMPLETED"
            )
            waiter.cancel()
            if not ready.is_set():
                raise AssertionError(f"the service never became ready:\n{running.tail()}")
            yield running
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                try:
                    async with asyncio.timeout(STOP_TIMEOUT_S):
                        await process.wait()
                except TimeoutError:
                    process.kill()
                    await process.wait()
    leaked = [line for line in running.log if any(s in line for s in secrets)]
    assert not leaked, f"secrets reached the service log: {leaked}"

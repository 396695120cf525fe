"""The real service (``chatbridge run``) as a subprocess, bridged to the test Synapse."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.matrix.synapse_peer import MatrixUser, SynapseServer

ROOT = Path(__file__).resolve().parents[2]
CHATBRIDGE = Path(sys.executable).parent / "chatbridge"
FAKE_CLAUDE = ROOT / "tests" / "fakes" / "fake_claude.py"
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


def config_toml(
    tmp: Path,
    *,
    synapse: SynapseServer,
    bot: MatrixUser,
    room_id: str,
    allowed: tuple[str, ...],
    matrix_extra: Mapping[str, object],
) -> str:
    """A service configuration with only the Matrix transport and the fake claude."""
    lines = [
        "[runner]",
        f'claude_bin = "{FAKE_CLAUDE}"',
        "stop_grace_s = 1",
        "[dispatcher]",
        "coalesce_ms = 300",
        "[database]",
        f'url = "sqlite+aiosqlite:///{tmp / "chatbridge.db"}"',
        "[console]",
        "enabled = false",
        "[http]",
        'listen = ""',
        "[defaults]",
        f'cwd = "{tmp}"',
        "[matrix]",
        f'homeserver = "{synapse.url}"',
        f'user_id = "{bot.user_id}"',
        f'store_path = "{tmp / "matrix-store"}"',
        "sync_timeout_ms = 5000",
    ]
    lines += [f"{name} = {value!r}" for name, value in matrix_extra.items()]
    lines += [
        "[[rooms]]",
        'transport = "matrix"',
        f'id = "{room_id}"',
        "allowed_users = [" + ", ".join(f'"{u}"' for u in allowed) + "]",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class Service:
    process: asyncio.subprocess.Process
    log: list[str] = field(default_factory=list)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log[-lines:])


@asynccontextmanager
async def service(
    tmp: Path,
    synapse: SynapseServer,
    bot: MatrixUser,
    room_id: str,
    *,
    allowed: tuple[str, ...],
    claude_env: Mapping[str, str] | None = None,
    matrix_extra: Mapping[str, object] | None = None,
) -> AsyncIterator[Service]:
    """``chatbridge run`` until the block ends (SIGTERM, then KILL); the bot's password
    comes from the environment, as in production, and must never reach the log."""
    require_service()
    config = tmp / "chatbridge.toml"
    config.write_text(
        config_toml(
            tmp,
            synapse=synapse,
            bot=bot,
            room_id=room_id,
            allowed=allowed,
            matrix_extra=matrix_extra or {},
        )
    )
    env = {**os.environ, **(claude_env or {}), "CHATBRIDGE_MATRIX__PASSWORD": bot.password}
    process = await asyncio.create_subprocess_exec(
        str(CHATBRIDGE),
        "run",
        "--config",
        str(config),
        env=env,
        cwd=tmp,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    running = Service(process)
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
    leaked = [line for line in running.log if bot.password in line]
    assert not leaked, f"the password reached the service log: {leaked}"

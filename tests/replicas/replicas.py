"""``chatbridge run`` replicas as real processes, each controllable on its own:
start, ``kill -9``, ``SIGSTOP``/``SIGCONT``, ``SIGTERM``, start again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bridge.core.model import ReplyKind
from tests.replicas.conftest import Replica
from tests.service_process import CHATBRIDGE, READY_LINE, START_TIMEOUT_S, require_service

STOP_TIMEOUT_S = 20.0
HEALTH_CHECK_NOISE = "ERROR bridge.host.http: http: answering a request failed"


@dataclass
class ReplicaProcess:
    """One replica: its id, ports and own state directory; the shared config file."""

    name: str
    config: Path
    home: Path
    http_port: int
    events_port: int | None
    env: Mapping[str, str]
    log: list[str] = field(default_factory=list)
    process: asyncio.subprocess.Process | None = None
    starts: int = 0
    check_errors: int = 0
    """Errors logged for health checks (see HEALTH_CHECK_NOISE)."""
    _reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def replica_env(self) -> dict[str, str]:
        env = {
            **os.environ,
            **self.env,
            "CHATBRIDGE_CLUSTER__REPLICA_ID": self.name,
            "FAKE_CLAUDE_RUN_TAG": self.name,
            "CHATBRIDGE_RUNNER__STATE_DIR": str(self.home / "state"),
            "CHATBRIDGE_HTTP__LISTEN": f"127.0.0.1:{self.http_port}",
        }
        # (The Slack events port is in each replica's config file:
        # CHATBRIDGE_SLACK__LISTEN=host:port is refused by the settings loader.)
        return env

    async def start(self) -> None:
        """Start it and wait for its ready line (bounded)."""
        require_service()
        assert not self.alive, f"{self.name} is already running"
        self.home.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self.log.append(f"----- {self.name} start #{self.starts}")
        process = await asyncio.create_subprocess_exec(
            str(CHATBRIDGE), "run", "--config", str(self.config),
            env=self.replica_env(),
            cwd=self.home,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # a signal to the test's group never reaches it
        )  # fmt: skip
        self.process = process
        ready = asyncio.Event()
        self._reader = asyncio.create_task(self._read(process, ready))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait(
            {waiter, self._reader}, timeout=START_TIMEOUT_S, return_when="FIRST_COMPLETED"
        )
        waiter.cancel()
        if not ready.is_set():
            raise AssertionError(f"replica {self.name} never became ready:\n{self.tail()}")

    async def _read(self, process: asyncio.subprocess.Process, ready: asyncio.Event) -> None:
        assert process.stderr is not None
        noise = False
        async for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip()
            # HAProxy's health checks end with a reset, which bridge.host.http logs as an
            # error with a traceback each time: counted, not kept (it would bury the rest).
            if HEALTH_CHECK_NOISE in line:
                noise = True
                self.check_errors += 1
                continue
            if noise and not line[:2].isdigit():
                continue
            noise = False
            self.log.append(line)
            if READY_LINE in line:
                ready.set()

    async def _reaped(self) -> None:
        assert self.process is not None
        await self.process.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def kill(self) -> None:
        """``kill -9``: no hand-over, its runs' supervisors left behind."""
        assert self.process is not None
        self.process.kill()
        await self._reaped()
        self.log.append(f"----- {self.name} killed")

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.log.append(f"----- {self.name} SIGSTOP")

    def resume(self) -> None:
        assert self.process is not None
        try:
            self.process.send_signal(signal.SIGCONT)
        except ProcessLookupError:
            # Killed while paused (a new Matrix leader stops one holding the store's lock).
            self.log.append(f"----- {self.name} gone before SIGCONT")
            return
        self.log.append(f"----- {self.name} SIGCONT")

    async def terminate(self) -> None:
        """``SIGTERM`` and wait (bounded; then SIGKILL)."""
        if not self.alive:
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)  # a paused one could not stop
        self.process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await self._reaped()
        except TimeoutError:
            self.process.kill()
            await self._reaped()
            raise AssertionError(f"{self.name} did not stop on SIGTERM:\n{self.tail()}") from None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log[-lines:])


def results(r: Replica) -> list[str]:
    return r.chat.texts(ReplyKind.RESULT)

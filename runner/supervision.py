"""The bridge's side of a run's supervisor (``runner/supervisor.py``).

The supervisor is started in a session of its own with claude's pipes,
environment and working directory; claude inherits the pipes, so reading
claude's output costs nothing extra. Two more pipes connect the two: the
control pipe (ours to write: ``stop``; its end of file, when we close it or
die, also stops the run) and the status pipe (the supervisor's JSON lines:
spawned, exited, done). The supervisor exits only once nothing of the run is
left; waiting for its exit is waiting for the run to be gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SUPERVISOR = Path(__file__).with_name("supervisor.py")

SUPERVISOR_KILL_S = 5.0 + 1.0
"""The supervisor's own bound after its grace period (KILL_DEADLINE_S), plus slack."""


@dataclass(frozen=True)
class Limits:
    """Where the run's cgroup goes and what it may use; an empty parent means no cgroup."""

    cgroup_parent: str = ""
    memory_max: int | None = None
    pids_max: int | None = None


class SpawnFailed(Exception):
    """The supervisor could not start claude; ``errno`` is the OSError's, if any."""

    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno


class Supervised:
    """A started run: the supervisor process, with claude's pipes on it."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        control: int,
        status: asyncio.StreamReader,
        transport: asyncio.BaseTransport,
        claude_pid: int,
    ) -> None:
        if proc.stdin is None or proc.stdout is None or proc.stderr is None:
            raise RuntimeError("the supervisor was started without pipes")
        self.proc = proc
        self.stdin: asyncio.StreamWriter = proc.stdin
        self.stdout: asyncio.StreamReader = proc.stdout
        self.stderr: asyncio.StreamReader = proc.stderr
        self.claude_pid = claude_pid
        self._control: int | None = control
        self._status = status
        self._status_transport = transport
        self._pidfd: int | None = None
        with contextlib.suppress(OSError):
            self._pidfd = os.pidfd_open(proc.pid)
        loop = asyncio.get_running_loop()
        self.claude_exit: asyncio.Future[int] = loop.create_future()
        """claude's return code (negative for a signal), once it exited."""
        self.survivors: list[int] | None = None
        """Pids that survived SIGKILL, from the supervisor's last word (None: no word)."""
        self._reader = asyncio.create_task(self._read_status())

    async def _read_status(self) -> None:
        while line := await self._status.readline():
            message = _decode(line)
            if "exited" in message and not self.claude_exit.done():
                self.claude_exit.set_result(int(message["exited"]))
            elif "done" in message:
                self.survivors = [int(p) for p in message["done"].get("survivors", [])]

    def stop(self) -> None:
        """Ask the supervisor to stop the run (TERM, grace, KILL); idempotent."""
        if self._control is None:
            return
        with contextlib.suppress(OSError):  # already gone: its run is stopped
            os.write(self._control, b"stop\n")

    async def wait(self, within: float) -> bool:
        """Wait up to ``within`` s for the supervisor, i.e. the whole run, to be gone."""
        try:
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), within)
        except TimeoutError:
            return False
        # Its last status line is read before it counts as done.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), 1.0)
        return True

    def kill(self) -> None:
        """SIGKILL the supervisor itself (it failed to finish): a last resort."""
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def close(self) -> None:
        """Release our ends; closing the control pipe alone stops a run still going."""
        if self._control is not None:
            os.close(self._control)
            self._control = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        self._status_transport.close()


def _decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def supervisor_argv(
    run_id: str, argv: list[str], *, control_fd: int, status_fd: int, grace_s: float, limits: Limits
) -> list[str]:
    """The supervisor's command line: the run id and fds, never any chat text."""
    command = [
        sys.executable, "-I", "-S", str(SUPERVISOR),
        f"--run-id={run_id}", f"--control-fd={control_fd}", f"--status-fd={status_fd}",
        f"--grace-s={grace_s!r}",
    ]  # fmt: skip
    if limits.cgroup_parent:
        command.append(f"--cgroup={limits.cgroup_parent}")
        if limits.memory_max is not None:
            command.append(f"--memory-max={limits.memory_max}")
        if limits.pids_max is not None:
            command.append(f"--pids-max={limits.pids_max}")
    return [*command, "--", *argv]


async def start(
    run_id: str,
    argv: list[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    grace_s: float,
    limits: Limits,
) -> Supervised:
    """Start the supervisor and wait until claude runs under it.

    Raises :class:`SpawnFailed` when claude could not be started (the
    supervisor has then exited), ``OSError`` when the supervisor itself could
    not (e.g. ``cwd`` is missing). Cancelled, it leaves nothing running.
    """
    loop = asyncio.get_running_loop()
    control_r, control_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *supervisor_argv(
                run_id,
                argv,
                control_fd=control_r,
                status_fd=status_w,
                grace_s=grace_s,
                limits=limits,
            ),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            # Its own session: terminal signals of the service never reach the run.
            start_new_session=True,
            close_fds=True,
            pass_fds=(control_r, status_w),
        )
    except BaseException:
        os.close(control_w)
        os.close(status_r)
        raise
    finally:
        # Only the supervisor may hold these ends: its death must close them.
        os.close(control_r)
        os.close(status_w)
    status = asyncio.StreamReader()
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(status), os.fdopen(status_r, "rb", buffering=0)
        )
        first = _decode(await status.readline())
    except BaseException:
        # Closing the control pipe stops whatever started; then wait for it to be gone.
        os.close(control_w)
        await asyncio.shield(proc.wait())
        raise
    if "spawned" not in first:
        os.close(control_w)
        transport.close()
        await proc.wait()
        if "spawn_failed" in first:
            raise SpawnFailed(str(first["spawn_failed"]), first.get("errno"))
        raise SpawnFailed(f"the run's supervisor exited with {proc.returncode}", None)
    if first.get("cgroup_error"):
        # Said once at start-up; worth a warning per run only when limits are lost.
        level = logging.WARNING if limits.memory_max or limits.pids_max else logging.DEBUG
        log.log(level, "run %s has no cgroup of its own: %s", run_id, first["cgroup_error"])
    return Supervised(proc, control_w, status, transport, int(first["spawned"]))

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

from bridge.core import stages
from runner.process import has_exited, kill_cgroup, kill_marked, kill_tree
from runner.supervisor import KILL_DEADLINE_S

log = logging.getLogger(__name__)

SUPERVISOR = Path(__file__).with_name("supervisor.py")

SUPERVISOR_KILL_S = KILL_DEADLINE_S + 1.0
"""The supervisor's own bound after its grace period, plus slack."""
CLOSE_S = 1.0
"""After the supervisor exited: how long asyncio may take to see claude's pipes end."""


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
        run_id: str,
        proc: asyncio.subprocess.Process,
        control: int,
        status: asyncio.StreamReader,
        transport: asyncio.BaseTransport,
        *,
        spawned: Mapping[str, Any],
    ) -> None:
        if proc.stdin is None or proc.stdout is None or proc.stderr is None:
            raise RuntimeError("the supervisor was started without pipes")
        self.run_id = run_id
        self.proc = proc
        self.stdin: asyncio.StreamWriter = proc.stdin
        self.stdout: asyncio.StreamReader = proc.stdout
        self.stderr: asyncio.StreamReader = proc.stderr
        self.claude_pid = int(spawned["spawned"])
        self.cgroup: str | None = spawned.get("cgroup") or None
        """The run's cgroup v2 group, if it has one."""
        self._control: int | None = control
        self._status = status
        self._status_transport = transport
        # Held from the start: after the supervisor's death these still name
        # its process and claude's, never a recycled pid.
        self._pidfd: int | None = _pin(proc.pid, parent=os.getpid())
        self._claude_fd: int | None = _pin(self.claude_pid, parent=proc.pid)
        loop = asyncio.get_running_loop()
        self.claude_exit: asyncio.Future[int] = loop.create_future()
        """claude's return code (negative for a signal), once it exited."""
        self.survivors: list[int] | None = None
        """Pids that survived SIGKILL, from the supervisor's last word (None: no word)."""
        self.gone: asyncio.Task[None] = asyncio.create_task(self._read_status())
        """Done once the status pipe ended: the supervisor exited (only it holds that pipe)."""

    async def _read_status(self) -> None:
        while line := await self._status.readline():
            message = _decode(line)
            if "exited" in message and not self.claude_exit.done():
                self.claude_exit.set_result(int(message["exited"]))
            elif "done" in message:
                self.survivors = [int(p) for p in message["done"].get("survivors", [])]

    @property
    def contained(self) -> bool:
        """The supervisor said it stopped the whole run (its "done" line)."""
        return self.survivors is not None

    def stop(self) -> None:
        """Ask the supervisor to stop the run (TERM, grace, KILL); idempotent.

        A supervisor that is gone cannot: :meth:`wait` then returns at once
        and :attr:`contained` tells that :meth:`contain` has to.
        """
        if self._control is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._control, b"stop\n")

    async def wait(self, within: float) -> bool:
        """Wait up to ``within`` s for the supervisor to be gone; whether it is.

        Its exit is the end of the status pipe, read to the last line: this
        does not depend on claude's pipes ending (a tool may hold them).
        """
        await asyncio.wait({self.gone}, timeout=within)
        return self.gone.done()

    async def contain(self) -> int:
        """Stop the run without its supervisor; return how many processes were killed.

        For a supervisor that died (SIGKILL, the OOM killer) or did not finish
        in time (stopped, stuck): first, while it is alive, its whole tree (see
        :func:`kill_tree`); then the run's cgroup; claude by its pidfd; and the
        marker sweep for whatever left the tree before. The /proc scans of
        the tree and the sweep run in a worker thread, off the event loop.
        """
        killed = 0
        if self._pidfd is not None:
            killed += await kill_tree(self._pidfd, self.proc.pid)
        if self.cgroup is not None:
            killed += await kill_cgroup(self.cgroup)
        if self._claude_fd is not None and not has_exited(self._claude_fd):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._claude_fd, signal.SIGKILL)
                killed += 1
        killed += await kill_marked(self.run_id, grace_s=0)
        await self.wait(SUPERVISOR_KILL_S)
        return killed

    async def close(self) -> None:
        """Release our ends; closing the control pipe alone stops a run still going."""
        if self._control is not None:
            os.close(self._control)
            self._control = None
        for fd in (self._pidfd, self._claude_fd):
            if fd is not None:
                os.close(fd)
        self._pidfd = self._claude_fd = None
        self.gone.cancel()
        await asyncio.gather(self.gone, return_exceptions=True)
        self._status_transport.close()
        if self.gone.cancelled():
            return  # still running: asyncio reaps it once it exits
        # Gone: let asyncio collect its exit status and close claude's pipes,
        # unless a process that escaped the run still holds them.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), CLOSE_S)


def _pin(pid: int, *, parent: int) -> int | None:
    """A pidfd for ``pid`` if it is still ``parent``'s child (else it is gone already)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        ppid = int(data[data.rfind(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        ppid = -1
    if ppid != parent:
        os.close(fd)
        return None
    return fd


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
    stages.stamp("spawn")
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
    stages.stamp("supervisor_forked")
    status = asyncio.StreamReader()
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(status), os.fdopen(status_r, "rb", buffering=0)
        )
        first = _decode(await status.readline())
        stages.stamp("claude_spawned")
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
    return Supervised(run_id, proc, control_w, status, transport, spawned=first)

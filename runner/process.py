"""Starting claude and making sure nothing of a run outlives it.

claude's Bash tool runs each command in its own session and process group,
and a command's ``cmd &`` outlives even a clean exit of claude, so neither
the process group nor the parent chain finds every process of a run. The
run's marker does: it sits in the environment of claude and is inherited by
every descendant, whatever its session, group or parent. The stop sequence
is SIGTERM to claude (and to every marked process, so the grace period runs
once for all of them), wait, SIGKILL claude's group, then kill whatever still
carries the marker until nothing does. Processes found by scanning are pinned
with a pidfd before they are signalled, so a recycled pid is never hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from runner.command import MARKER_ENV

log = logging.getLogger(__name__)

SWEEP_DEADLINE_S = 5.0
"""How long a sweep keeps killing processes that carry a marker (forks in flight)."""

REAP_WAIT_S = 5.0
"""Bound on waiting for claude itself after SIGKILL (only a D-state process takes long)."""

_PROC = Path("/proc")


class Claude:
    """The claude process of a run, with a pidfd pinning it.

    Signals go through the pidfd, never through ``Popen.send_signal``: that
    one polls first and may reap the child behind asyncio's child watcher,
    which then reports exit status 255. The pidfd also makes sure a signal
    never reaches a recycled pid.
    """

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid
        try:
            self._fd: int | None = os.pidfd_open(proc.pid)
        except ProcessLookupError:  # already exited and reaped
            self._fd = None

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to claude unless it has exited."""
        if self._fd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._fd, sig)

    async def wait(self, within: float) -> bool:
        """Wait for claude to exit and be reaped, at most ``within`` s; True if it was."""
        try:
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), within)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Release the pidfd (after the run)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


async def spawn(argv: list[str], env: Mapping[str, str], cwd: Path) -> Claude:
    """Start claude in its own session with pipes on stdin, stdout and stderr.

    Its own session keeps terminal signals of the service (Ctrl-C) away from it,
    so that stopping a run is always this module's decision.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        # Do not let the service's other descriptors leak into claude's tools.
        close_fds=True,
    )
    return Claude(proc)


def _carries(pid: int, entry: bytes) -> bool:
    """Whether process ``pid`` has ``entry`` (``NAME=value``) in its environment."""
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, a kernel thread, or not ours to read
        return False
    return entry in environ.split(b"\0")


def _marker_entry(marker: str) -> bytes:
    return f"{MARKER_ENV}={marker}".encode()


def find_marked(marker: str) -> list[int]:
    """Pids of live processes whose environment carries ``marker`` (never our own pid).

    A zombie has an empty environment and is not listed: it is already dead.
    """
    if not marker:
        raise ValueError("empty marker")
    entry = _marker_entry(marker)
    me = os.getpid()
    found: list[int] = []
    for child in _PROC.iterdir():
        if not child.name.isdigit():
            continue
        pid = int(child.name)
        if pid != me and _carries(pid, entry):
            found.append(pid)
    return found


class _Pinned:
    """A process held by a pidfd: signals go to it, never to a reused pid."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd

    def signal(self, sig: signal.Signals) -> bool:
        """Send ``sig``; False if the process already exited."""
        try:
            signal.pidfd_send_signal(self.fd, sig)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        os.close(self.fd)


def _pin_marked(marker: str) -> list[_Pinned]:
    """Pin every process carrying ``marker``, checking the marker again once pinned."""
    entry = _marker_entry(marker)
    pinned: list[_Pinned] = []
    for pid in find_marked(marker):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        # The pid may have been recycled between the scan and the pin.
        if _carries(pid, entry):
            pinned.append(_Pinned(pid, fd))
        else:
            os.close(fd)
    return pinned


async def _wait_exited(procs: list[_Pinned], within: float) -> list[_Pinned]:
    """Wait until every process exited, at most ``within`` s; return those still running.

    A pidfd becomes readable when its process exits, which works for
    processes that are not our children.
    """
    loop = asyncio.get_running_loop()
    waiting: dict[int, tuple[_Pinned, asyncio.Future[None]]] = {}
    for proc in procs:
        fut: asyncio.Future[None] = loop.create_future()
        loop.add_reader(proc.fd, _set_done, fut)
        waiting[proc.fd] = (proc, fut)
    try:
        futures = [fut for _, fut in waiting.values()]
        if futures:
            await asyncio.wait(futures, timeout=within)
        return [proc for proc, fut in waiting.values() if not fut.done()]
    finally:
        for fd in waiting:
            loop.remove_reader(fd)


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is our child (we may be a subreaper)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


async def kill_marked(marker: str, grace_s: float) -> int:
    """Kill every process whose environment carries ``marker``; return how many.

    SIGTERM first; whatever still runs after ``grace_s`` gets SIGKILL, and the
    scan repeats (a process may fork while we kill) until none is left or
    :data:`SWEEP_DEADLINE_S` passed. Used after every run, and at startup to
    sweep runs a crash left behind.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s + SWEEP_DEADLINE_S
    killed: set[int] = set()
    sig = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
    while True:
        procs = _pin_marked(marker)
        if not procs:
            break
        try:
            for proc in procs:
                if proc.signal(sig):
                    killed.add(proc.pid)
            wait = grace_s if sig == signal.SIGTERM else 1.0
            left = await _wait_exited(procs, min(wait, max(0.0, deadline - loop.time())))
            for proc in procs:
                if proc not in left:
                    _reap(proc.pid)
        finally:
            for proc in procs:
                proc.close()
        sig = signal.SIGKILL
        if loop.time() >= deadline:
            if find_marked(marker):
                log.error("processes marked %s survived the sweep", marker)
            break
    return len(killed)


async def stop_tree(claude: Claude, marker: str, grace_s: float) -> None:
    """The stop sequence: leave no process of the run alive. Bounded in time.

    SIGTERM goes to claude (it stops its running tools itself) and to every
    marked process at once. After ``grace_s`` claude's group and whatever of
    them still runs get SIGKILL; then every process still carrying the marker
    does. Returns only once the processes it signalled have exited: one that
    is half-way through exiting has already lost its environment to a scan.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    pinned = _pin_marked(marker)
    try:
        for proc in pinned:
            proc.signal(signal.SIGTERM)
        claude.signal(signal.SIGTERM)
        exited = await claude.wait(grace_s)
        left = await _wait_exited(pinned, max(0.0, deadline - loop.time()))
        if not exited:
            # claude's pid is its group's id (its own session), and claude is not
            # reaped yet, so the group id cannot have been recycled.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(claude.pid, signal.SIGKILL)
            claude.signal(signal.SIGKILL)
        for proc in left:
            proc.signal(signal.SIGKILL)
        if not exited and not await claude.wait(REAP_WAIT_S):
            log.error("claude pid %d did not exit after SIGKILL", claude.pid)
        if await _wait_exited(left, REAP_WAIT_S):
            log.error("processes marked %s did not exit after SIGKILL", marker)
        for proc in pinned:
            if proc.pid != claude.pid:
                _reap(proc.pid)
    finally:
        for proc in pinned:
            proc.close()
    # Processes started meanwhile (a fork in flight) are caught by the sweep.
    await kill_marked(marker, grace_s=0)


def become_subreaper() -> bool:
    """Make this process adopt orphans of its descendants (Linux PR_SET_CHILD_SUBREAPER).

    Optional, for the service's main process: orphaned tool processes then
    become our children, so the sweep can reap those it kills instead of
    leaving zombies to init. Caveat: an orphan that exits on its own before
    any sweep stays a zombie of ours (the sweep cannot tell it from a child
    asyncio is waiting for), so enable this only with a reaping strategy.
    Process-wide and irreversible for the process: the service decides, never
    the runner. Returns False where the call is not available.
    """
    pr_set_child_subreaper = 36
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False

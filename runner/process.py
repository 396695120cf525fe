"""The marker sweep: the last resort for processes of a run nobody supervises.

Each run is contained by its supervisor (``runner/supervisor.py``), which
leaves nothing behind. The run's marker, an environment variable inherited
by every descendant that does not clear its environment, is kept for the
one case a supervisor cannot cover: crash recovery after the supervisor
itself was killed (e.g. with SIGKILL). A scan of /proc finds the processes
still carrying it; each is pinned with a pidfd before it is signalled, so a
recycled pid is never hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

from runner.command import MARKER_ENV

log = logging.getLogger(__name__)

SWEEP_DEADLINE_S = 5.0
"""How long a sweep keeps killing processes that carry a marker (forks in flight)."""

_PROC = Path("/proc")


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
    :data:`SWEEP_DEADLINE_S` passed. Used at startup to sweep runs a crash
    left behind, and after a supervisor that had to be killed.
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

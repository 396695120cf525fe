"""Stopping a run's processes without its supervisor: the bridge's fallbacks.

When the supervisor cannot contain the run (killed, stopped, or found gone with the journal
cut short), the bridge stops what it can still find, strongest first: :func:`kill_tree`
(by parent link, a live supervisor frozen first), :func:`kill_cgroup` (``cgroup.kill``),
:func:`kill_marked` (the run's environment marker). Every process is pinned with a pidfd
before it is signalled; /proc scans run in a worker thread, never on the event loop
(docs/operations.md, "What contains a run").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
from collections.abc import Sequence
from pathlib import Path

from runner.command import MARKER_ENV
from runner.proctree import KILL_POLL_S, Cgroup, descendants, signal_all
from runner.supervisor import KILL_DEADLINE_S

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


async def find_marked_off_loop(marker: str) -> list[int]:
    """:func:`find_marked` in a worker thread: the event loop goes on meanwhile."""
    return await asyncio.to_thread(find_marked, marker)


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


async def _pin_marked(marker: str) -> list[_Pinned]:
    """Pin every process carrying ``marker``, checking the marker again once pinned.

    The scan runs in a worker thread and returns pids only: pidfds are opened
    here, so a cancelled sweep never leaves one open in a thread's result.
    """
    entry = _marker_entry(marker)
    pinned: list[_Pinned] = []
    for pid in await find_marked_off_loop(marker):
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


async def wait_exited(pidfds: Sequence[int], within: float) -> set[int]:
    """Wait until every process behind ``pidfds`` exited, at most ``within`` s.

    Returns the pidfds whose process is still running. A pidfd becomes
    readable when its process exits, which works for processes that are not
    our children.
    """
    loop = asyncio.get_running_loop()
    waiting: dict[int, asyncio.Future[None]] = {}
    for fd in pidfds:
        fut: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _set_done, fut)
        waiting[fd] = fut
    try:
        if waiting:
            await asyncio.wait(waiting.values(), timeout=within)
        return {fd for fd, fut in waiting.items() if not fut.done()}
    finally:
        for fd in waiting:
            loop.remove_reader(fd)


async def _wait_exited(procs: list[_Pinned], within: float) -> list[_Pinned]:
    """The pinned processes still running after waiting up to ``within`` s."""
    running = await wait_exited([proc.fd for proc in procs], within)
    return [proc for proc in procs if proc.fd in running]


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
    :data:`SWEEP_DEADLINE_S` passed. The last resort, after the stronger
    means above: it misses processes that cleared their environment.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s + SWEEP_DEADLINE_S
    killed: set[int] = set()
    sig = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
    while True:
        procs = await _pin_marked(marker)
        if not procs:
            # Only an empty scan ends the sweep early: a scan whose processes
            # all exited before they were pinned may have missed their
            # children (a process that keeps forking and exiting), so scan
            # again, still bounded by the deadline.
            if not await find_marked_off_loop(marker) or loop.time() >= deadline:
                break
            continue
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
            if await find_marked_off_loop(marker):
                log.error("processes marked %s survived the sweep", marker)
            break
    return len(killed)


def has_exited(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has exited (its pidfd turned readable)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


async def kill_tree(pidfd: int, pid: int) -> int:
    """Kill a live supervisor's whole run, then the supervisor; return how many processes.

    The supervisor (``pid``, pinned by ``pidfd``) is frozen first so it reaps
    nothing: every process of the run keeps its parent link to it (orphans
    re-parent to it, a child subreaper), however it cleared its environment.
    Each scan freezes all it finds before killing any, so a fork in flight is
    found by the next scan. Once the supervisor has exited its orphans belong
    to init and cannot be found this way: call this before killing it.
    """
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
    deadline = loop.time() + KILL_DEADLINE_S
    killed: set[int] = set()
    while not has_exited(pidfd):
        # Killed ones stay zombies (nobody reaps): not listed.
        tree = await asyncio.to_thread(_freeze_and_kill_descendants, pid)
        if not tree:
            break
        killed.update(tree)
        if loop.time() >= deadline:
            log.error("processes of supervisor %d survived SIGKILL: %s", pid, tree)
            break
        await asyncio.sleep(KILL_POLL_S)
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    return len(killed)


def _freeze_and_kill_descendants(pid: int) -> list[int]:
    """One scan of ``pid``'s tree, every process found frozen then killed; the pids found.

    Blocking (a whole /proc scan): run it in a worker thread.
    """
    tree = descendants(pid)
    if tree:
        signal_all(tree, (signal.SIGSTOP, signal.SIGKILL), {pid, *tree})
    return tree


async def kill_cgroup(path: str) -> int:
    """Kill every process in the cgroup v2 group ``path`` and remove it; return how many.

    ``cgroup.kill`` is atomic: a process forking meanwhile lands in the group
    and dies with it. A group that does not exist (any more) holds nothing.
    """
    loop = asyncio.get_running_loop()
    group = Cgroup(os.path.dirname(path), os.path.basename(path))
    held = _kill_group(group)
    if held is None:
        return 0
    deadline = loop.time() + KILL_DEADLINE_S
    # The group can be removed once the kernel let go of its last (exiting) member.
    while not (not group.procs() and group.remove(0)):
        if loop.time() >= deadline:
            log.error("the cgroup %s is still busy after cgroup.kill: %s", path, group.procs())
            break
        await asyncio.sleep(KILL_POLL_S)
    return len(held)


def _kill_group(group: Cgroup) -> list[int] | None:
    """``cgroup.kill`` the group; the pids it held, or None if there is no such group."""
    if not os.path.isdir(group.path):
        return None
    held = group.procs()
    if not group.kill():
        log.error("cannot kill the cgroup %s (cgroup.kill needs Linux 5.14)", group.path)
        return None
    return held

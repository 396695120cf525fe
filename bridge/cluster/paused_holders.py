"""A replica paused while it held a lock on a shared file, stopped by the replica that needs it.

Before a new Matrix leader connects, a process that holds a lock on nio's store under the
shared ``[matrix] store_path``, is stopped, and is a replica registered on this host is killed
(``SIGKILL``; it lost its lease and would stop once it ran); its runs are taken over as after
a ``kill -9``. A holder on another host or in another pid namespace is out of reach
(docs/replicas.md, "Transports").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterable, Mapping
from pathlib import Path

from runner.process import wait_exited
from runner.proctree import is_stopped, start_time

log = logging.getLogger(__name__)

PROC = Path("/proc")
EXIT_WAIT_S = 5.0
"""How long a killed holder may take to exit (and so let go of its locks)."""
CLOCK_SLACK_S = 5.0
"""A replica's registration time is the database's clock, a process's start this host's."""


def lock_holders(paths: Iterable[Path], proc_locks: Path = PROC / "locks") -> set[int]:
    """Pids of the processes holding a lock on any of ``paths``, from ``/proc/locks``.

    Matched by inode alone: on an overlay filesystem (a container's) the
    device that ``stat`` reports is not the one the kernel's lock table names.
    """
    inodes = set()
    for path in paths:
        with contextlib.suppress(OSError):
            inodes.add(path.stat().st_ino)
    if not inodes:
        return set()
    holders = set()
    for line in proc_locks.read_text().splitlines():
        # "1: POSIX  ADVISORY  WRITE 4242 fe:00:1474578 0 EOF"; a waiter's
        # line has "->" after the number: it holds nothing yet.
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":
            continue
        try:
            pid, inode = int(fields[4]), int(fields[5].rpartition(":")[2])
        except ValueError:
            continue
        if inode in inodes and pid > 0:
            holders.add(pid)
    return holders


def has_open(pid: int, paths: Iterable[Path]) -> bool:
    """Whether process ``pid`` has one of ``paths`` open (by device and inode)."""
    wanted = set()
    for path in paths:
        with contextlib.suppress(OSError):
            info = path.stat()
            wanted.add((info.st_dev, info.st_ino))
    try:
        fds = os.listdir(PROC / str(pid) / "fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            info = os.stat(PROC / str(pid) / "fd" / fd)  # the open file itself
            if (info.st_dev, info.st_ino) in wanted:
                return True
    return False


def started_at(pid: int) -> float | None:
    """When process ``pid`` started (wall clock), from ``/proc``; None if unknown."""
    try:
        ticks = start_time(pid)
        boot = next(
            float(line.split()[1])
            for line in (PROC / "stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _is_the_replica(pid: int, registered: float) -> bool:
    """Whether ``pid`` is still the process that registered as a replica then (not a
    process that got its pid since: one started after the registration)."""
    began = started_at(pid)
    return began is not None and began <= registered + CLOCK_SLACK_S


async def stop_paused_holders(paths: Iterable[Path], replicas: Mapping[int, float]) -> list[int]:
    """Kill the stopped processes among ``replicas`` (pids on this host, with when they
    registered) that hold a lock on ``paths``, and wait for them to exit; their pids."""
    files = list(paths)
    holders = await asyncio.to_thread(lock_holders, files)
    killed = []
    for pid in sorted(holders & set(replicas)):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue  # gone already
        try:
            # Pinned by its pidfd: still the same process, still stopped, the
            # replica that registered (not a later owner of its pid), with the
            # store itself open (a lock matched by inode alone may be another
            # filesystem's file).
            if not (
                is_stopped(pid)
                and _is_the_replica(pid, replicas[pid])
                and await asyncio.to_thread(has_open, pid, files)
            ):
                continue
            log.warning(
                "replica process %d is stopped and holds a lock on the Matrix store:"
                " killing it (it lost its lease and would stop as soon as it ran)",
                pid,
            )
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            if await wait_exited([pidfd], EXIT_WAIT_S):
                log.error("replica process %d did not exit after SIGKILL", pid)
            killed.append(pid)
        finally:
            os.close(pidfd)
    return killed


__all__ = ["has_open", "lock_holders", "started_at", "stop_paused_holders"]

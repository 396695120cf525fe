"""A run's processes, found and signalled without the run's help: /proc and cgroup v2.

Used by the run's supervisor (``runner/supervisor.py``, which imports only
the standard library, and this module with it) and by the bridge's
fallbacks (``runner/process.py``). Every process is pinned with a pidfd
before it is signalled, so a recycled pid is never hit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterable

KILL_POLL_S = 0.02
"""In the kill phase, how often to look for processes a fork in flight created."""


def start_time(pid: int | str = "self") -> int:
    """The process's start time (``/proc/PID/stat`` field 22); pins a pid against reuse."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return int(data[data.rfind(b")") + 2 :].split()[19])


# --- the processes of the run -------------------------------------------------


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1])


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (by a signal or a tracer); False if it is gone."""
    stat = _stat(pid)
    return stat is not None and stat[0] in ("T", "t")


def descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of ``root``, found through the ppid links in /proc.

    /proc/PID/task/TID/children would be cheaper but needs CONFIG_PROC_CHILDREN,
    which many kernels lack; a stop is rare enough for one scan of /proc.
    """
    children: dict[int, list[int]] = {}
    zombies: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        stat = _stat(pid)
        if stat is None:
            continue
        state, ppid = stat
        children.setdefault(ppid, []).append(pid)
        if state in ("Z", "X"):
            zombies.add(pid)
    found: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid not in zombies:
            found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def signal_all(pids: Iterable[int], sigs: tuple[signal.Signals, ...], mine: set[int]) -> int:
    """Send ``sigs`` in order to each pid that is still one of ``mine``; return how many.

    Each process is pinned with a pidfd first, then checked to still have a
    parent in the run: a pid recycled since the scan is never signalled. A
    process we may not signal (another user's, after a setuid tool) is
    skipped, not fatal: the stop goes on for the rest, and it is reported as
    a survivor in the end.
    """
    pinned: list[int] = []
    try:
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            stat = _stat(pid)
            if stat is None or stat[1] not in mine:
                os.close(fd)
                continue
            pinned.append(fd)
        for sig in sigs:  # all get SIGSTOP before any gets SIGKILL: no fork slips through
            for fd in pinned:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    signal.pidfd_send_signal(fd, sig)
        return len(pinned)
    finally:
        for fd in pinned:
            os.close(fd)


class Cgroup:
    """The run's own cgroup v2 group: created before claude starts, removed when empty."""

    def __init__(self, parent: str, run_id: str) -> None:
        self.path = os.path.join(parent, run_id)

    def create(self, memory_max: int | None, pids_max: int | None) -> None:
        """Create the group and set its limits. Raises OSError."""
        wanted = [n for n, v in (("memory", memory_max), ("pids", pids_max)) if v is not None]
        if wanted:
            enable_controllers(os.path.dirname(self.path), wanted)
        os.mkdir(self.path)
        try:
            if memory_max is not None:
                self._write("memory.max", str(memory_max))
                # No swap beyond the limit, or the limit would only slow a run down.
                with contextlib.suppress(OSError):
                    self._write("memory.swap.max", "0")
            if pids_max is not None:
                self._write("pids.max", str(pids_max))
        except OSError:
            self.remove(0)
            raise

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def enter(self) -> None:
        """Move the calling process into the group (in claude's child before exec)."""
        self._write("cgroup.procs", "0")

    def procs(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(line) for line in f if line.strip()]
        except OSError:
            return []

    def kill(self) -> bool:
        """Kill every process in the group at once (Linux 5.14+); False if unsupported."""
        try:
            self._write("cgroup.kill", "1")
        except OSError:
            return False
        return True

    def remove(self, within: float) -> bool:
        """Remove the group, retrying while the kernel still counts exiting members."""
        deadline = time.monotonic() + within
        while True:
            try:
                os.rmdir(self.path)
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(KILL_POLL_S)
            else:
                return True


def own_cgroup() -> str:
    """The cgroup v2 directory this process is in. Raises OSError if there is none.

    Works on a pure v2 host and on a hybrid one (v2 mounted beside v1, e.g. at
    /sys/fs/cgroup/unified).
    """
    mount = ""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            # ... mount point (5th) ... " - " fstype source options
            if fields[fields.index("-") + 1] == "cgroup2":
                mount = fields[4]
                break
    if not mount:
        raise OSError(errno.ENOENT, "no cgroup v2 hierarchy is mounted")
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return os.path.join(mount, line[3:].strip().lstrip("/"))
    raise OSError(errno.ENOENT, "this process is in no cgroup v2 group")


def cgroup_parent(root: str) -> str:
    """Where runs' groups go: ``root``, or our own group for ``auto``. Raises OSError."""
    return own_cgroup() if root == "auto" else root


def enable_controllers(parent: str, names: Iterable[str]) -> None:
    """Make ``names`` (memory, pids) available to groups under ``parent``. Raises OSError.

    Fails with EBUSY when ``parent`` has processes of its own and is not the
    root (cgroup v2's "no internal processes" rule): give chatbridge a
    delegated group whose processes live in a leaf below it.
    """
    with open(os.path.join(parent, "cgroup.subtree_control")) as f:
        enabled = set(f.read().split())
    missing = [name for name in names if name not in enabled]
    if not missing:
        return
    try:
        with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
            f.write(" ".join(f"+{name}" for name in missing))
    except OSError as exc:
        raise OSError(
            exc.errno,
            f"cannot enable the {', '.join(missing)} controller(s) in {parent}: {exc.strerror}",
        ) from exc

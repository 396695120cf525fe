"""The supervisor of one run: claude's parent, and the reaper of everything claude starts.

The runner starts it in a session of its own, by path and with ``-I -S`` so
it imports only the standard library and no room setting (``PYTHONPATH``...)
changes what runs::

    python -I -S runner/supervisor.py --run-id=ID --control-fd=N --status-fd=M
        --grace-s=S [--cgroup=DIR [--memory-max=BYTES] [--pids-max=N]] -- CLAUDE_ARGV...

with claude's environment, working directory and stdin/stdout/stderr pipes,
which claude inherits (the supervisor itself lets go of them). It is a child
subreaper, so a tool that double-forks, clears its environment or starts its
own session still re-parents to it, never to init: "no child left" means
nothing of the run is left. With ``--cgroup`` claude also runs in its own
cgroup v2 group under DIR, killed at once with ``cgroup.kill``.

Control fd (read): ``stop`` ends the run; end of file means the bridge is
gone (even after ``kill -9``: the kernel closes its end), which ends the run
too. SIGTERM, SIGINT and SIGHUP do the same.

Status fd (write), one JSON object a line:
``{"spawned": PID, "cgroup": DIR or null, "cgroup_error": TEXT}`` or
``{"spawn_failed": TEXT, "errno": N}``,
then ``{"exited": STATUS}`` (claude's return code, negative for a signal),
then ``{"done": {"survivors": [PID...]}}``.

The stop, whatever asked for it (a stop, the bridge's death, claude's own
exit): SIGTERM to claude and to every descendant, up to the grace period for
them to go, then freeze (SIGSTOP, or ``cgroup.kill``) and SIGKILL whatever is
left, reaping, until there is no child. Exit status: 0 when nothing is left,
1 when something survived SIGKILL, 2 for bad arguments, 3 when claude could
not be started.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable

KILL_DEADLINE_S = 5.0
"""After SIGKILL: how long to keep killing and reaping before giving up (D state)."""
KILL_POLL_S = 0.02
"""In the kill phase, how often to look for processes a fork in flight created."""
RMDIR_DEADLINE_S = 1.0
"""How long an emptied cgroup may stay busy before it is left behind."""

EXIT_CLEAN = 0
EXIT_SURVIVORS = 1
EXIT_USAGE = 2
EXIT_SPAWN_FAILED = 3

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Options:
    """The parsed command line. A plain class: ``dataclasses`` (with ``inspect``)
    would add about a quarter to this process's start-up, which every run waits for."""

    __slots__ = (
        "argv",
        "cgroup",
        "control_fd",
        "grace_s",
        "memory_max",
        "pids_max",
        "run_id",
        "status_fd",
    )

    def __init__(
        self,
        *,
        run_id: str,
        control_fd: int,
        status_fd: int,
        grace_s: float,
        argv: list[str],
        cgroup: str = "",
        memory_max: int | None = None,
        pids_max: int | None = None,
    ) -> None:
        self.run_id = run_id
        self.control_fd = control_fd
        self.status_fd = status_fd
        self.grace_s = grace_s
        self.argv = argv
        self.cgroup = cgroup
        self.memory_max = memory_max
        self.pids_max = pids_max


def parse(args: list[str]) -> Options:
    """``--name=value`` options, ``--``, then claude's argv. Raises ValueError."""
    if "--" not in args:
        raise ValueError("missing -- before claude's argv")
    split = args.index("--")
    values: dict[str, str] = {}
    for arg in args[:split]:
        name, eq, value = arg.partition("=")
        if not name.startswith("--") or not eq:
            raise ValueError(f"bad option {arg!r}")
        values[name[2:]] = value
    argv = args[split + 1 :]
    if not argv:
        raise ValueError("no claude argv")

    def optional_int(name: str) -> int | None:
        return int(values.pop(name)) if values.get(name) else None

    options = Options(
        run_id=values.pop("run-id"),
        control_fd=int(values.pop("control-fd")),
        status_fd=int(values.pop("status-fd")),
        grace_s=float(values.pop("grace-s")),
        argv=argv,
        cgroup=values.pop("cgroup", ""),
        memory_max=optional_int("memory-max"),
        pids_max=optional_int("pids-max"),
    )
    values.pop("memory-max", None)
    values.pop("pids-max", None)
    if values:
        raise ValueError(f"unknown options {sorted(values)}")
    if not options.run_id or "/" in options.run_id or options.run_id.startswith("."):
        raise ValueError(f"bad run id {options.run_id!r}")
    return options


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


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


# --- the supervisor -----------------------------------------------------------


class Supervisor:
    """Reaps, and stops the tree once asked or once claude exits."""

    def __init__(
        self, options: Options, claude: int, cgroup: Cgroup | None, report: Callable[[object], None]
    ) -> None:
        self.options = options
        self.claude = claude
        self.cgroup = cgroup
        self.report = report
        self.me = os.getpid()
        self.claude_running = True
        self.has_children = True
        """As of the last :meth:`reap`: False once no child is left, hence no descendant."""
        self.stop_deadline: float | None = None
        """Set once the stop began: when the grace period ends."""

    def reap(self) -> bool:
        """Collect every exited child; False once there is no child left at all."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.has_children = False
                return False
            if pid == 0:
                return True
            if pid == self.claude:
                self.claude_running = False
                self.report({"exited": os.waitstatus_to_exitcode(status)})

    def begin_stop(self) -> None:
        """SIGTERM to the whole tree, once; the grace period starts now."""
        if self.stop_deadline is not None:
            return
        self.stop_deadline = time.monotonic() + self.options.grace_s
        self._signal_tree((signal.SIGTERM,))

    def kill_tree(self) -> None:
        """Freeze and kill whatever of the run is left."""
        if self.cgroup is not None and self.cgroup.kill():
            pass  # atomic: a fork in flight lands in the group and dies with it
        self._signal_tree((signal.SIGSTOP, signal.SIGKILL))

    def _signal_tree(self, sigs: tuple[signal.Signals, ...]) -> None:
        tree = self._tree()
        mine = {self.me, *tree}
        signal_all(tree, sigs, mine)

    def _tree(self) -> list[int]:
        """The run's live processes; none without a scan once no child is left.

        A subreaper without a child has no descendant at all (the usual end:
        claude exited and left nothing), so /proc is not read then. Otherwise
        the scan of descendants joins the cgroup's list: a process that moved
        itself out of the group is still a descendant and still gets the
        SIGTERM. (This process is the run's own, so a scan here never holds up
        the bridge's event loop.)
        """
        if not self.has_children:
            return []
        return self.survivors()

    def survivors(self) -> list[int]:
        tree = descendants(self.me)
        if self.cgroup is not None:
            tree = list(dict.fromkeys([*tree, *self.cgroup.procs()]))
        return tree

    def serve(self, control: int, wakeup: int, stop_signalled: _StopFlag) -> int:
        """The event loop: signals (through the wakeup fd) and the control fd."""
        selector = selectors.DefaultSelector()
        selector.register(wakeup, selectors.EVENT_READ)
        selector.register(control, selectors.EVENT_READ)
        kill_deadline: float | None = None
        while True:
            has_children = self.reap()
            if stop_signalled.value or not self.claude_running:
                self.begin_stop()
            now = time.monotonic()
            if self.stop_deadline is not None:
                empty = not has_children and not (self.cgroup and self.cgroup.procs())
                if empty:
                    return self._done([])
                if now >= self.stop_deadline:
                    if kill_deadline is None:
                        kill_deadline = now + KILL_DEADLINE_S
                    elif now >= kill_deadline:
                        return self._done(self.survivors())
                    self.kill_tree()
                    timeout: float | None = KILL_POLL_S
                else:
                    timeout = self.stop_deadline - now
            else:
                timeout = None
            for key, _ in selector.select(timeout):
                if key.fd == wakeup:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wakeup, 512):
                            pass
                else:
                    try:
                        data = os.read(control, 512)
                    except OSError:
                        data = b""
                    if not data or b"stop" in data:
                        # End of file: the bridge is gone; a run nobody reads must end.
                        if not data:
                            selector.unregister(control)
                        self.begin_stop()

    def _done(self, survivors: list[int]) -> int:
        if self.cgroup is not None and not survivors:
            self.cgroup.remove(RMDIR_DEADLINE_S)
        self.report({"done": {"survivors": survivors}})
        return EXIT_SURVIVORS if survivors else EXIT_CLEAN


class _StopFlag:
    def __init__(self) -> None:
        self.value = False

    def set(self, signum: int, frame: object) -> None:
        self.value = True


def _reporter(fd: int) -> Callable[[object], None]:
    def report(message: object) -> None:
        # The bridge may be gone: the run still has to be stopped, so never fail here.
        with contextlib.suppress(OSError):
            os.write(fd, json.dumps(message).encode() + b"\n")

    return report


def _spawn(argv: list[str], cgroup: Cgroup | None) -> int:
    """Start claude in a session of its own, on our stdin/stdout/stderr. Raises OSError."""
    proc = subprocess.Popen(
        argv,
        start_new_session=True,
        close_fds=True,
        # Only with a cgroup: a preexec_fn rules out the faster vfork path. Safe
        # here: the supervisor has no other thread.
        preexec_fn=cgroup.enter if cgroup is not None else None,  # noqa: PLW1509
    )
    pid = proc.pid
    # We reap with waitpid(-1); Popen must not try to.
    proc.returncode = 0
    return pid


def _make_cgroup(options: Options) -> tuple[Cgroup | None, str]:
    """The run's cgroup if one was asked for and could be made, else why not.

    Without one the run is still contained (the subreaper); the bridge said
    at start-up whether groups and limits are available.
    """
    if not options.cgroup:
        return None, ""
    try:
        cgroup = Cgroup(cgroup_parent(options.cgroup), options.run_id)
        cgroup.create(options.memory_max, options.pids_max)
    except OSError as exc:
        return None, str(exc)
    return cgroup, ""


def main(args: list[str]) -> int:
    try:
        options = parse(args)
    except (ValueError, KeyError) as exc:
        sys.stderr.write(f"supervisor: {exc}\n")
        return EXIT_USAGE
    report = _reporter(options.status_fd)
    os.set_blocking(options.status_fd, True)
    if not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        report({"spawn_failed": "cannot become a child subreaper", "errno": None})
        return EXIT_SPAWN_FAILED
    # A second guard beside the control fd: our parent's death stops the run.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    # A handler (not SIG_DFL) so SIGCHLD reaches the wakeup fd; a stop signal
    # only sets the flag, so even one before claude started stops the run.
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stop_signalled = _StopFlag()
    for sig in _STOP_SIGNALS:
        signal.signal(sig, stop_signalled.set)

    cgroup, cgroup_error = _make_cgroup(options)
    try:
        try:
            claude = _spawn(options.argv, cgroup)
        except subprocess.SubprocessError as exc:
            # Only the preexec_fn raises this: claude's child could not enter the
            # group and exited before exec. As when the group cannot be made, the
            # run goes on without it (the subreaper still contains it).
            if cgroup is None:
                raise
            cgroup_error = f"cannot move claude into {cgroup.path}: {exc}"
            cgroup.remove(RMDIR_DEADLINE_S)
            cgroup = None
            claude = _spawn(options.argv, None)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        code = exc.errno if isinstance(exc, OSError) else None
        report({"spawn_failed": str(exc), "errno": code})
        if cgroup is not None:
            cgroup.remove(0)
        return EXIT_SPAWN_FAILED
    # Only claude and its descendants hold the pipes now: their end is the run's end.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    report(
        {"spawned": claude, "cgroup": cgroup.path if cgroup else None, "cgroup_error": cgroup_error}
    )
    supervisor = Supervisor(options, claude, cgroup, report)
    return supervisor.serve(options.control_fd, wake_r, stop_signalled)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

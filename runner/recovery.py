"""After a restart: stop what is left of a run the bridge will not attach to again.

Runs the registry does not name (spawned but not registered, a previous version's, a stray
run directory): a live old supervisor gets SIGTERM (pinned with a pidfd), its grace and kill
phase, and is stopped by force with its tree only if it does not finish; then the run's
cgroup and the marker sweep. /proc scans run in a worker thread
(docs/operations.md, "What contains a run"; docs/detached-runs.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from pathlib import Path

from runner.command import MARKER_ENV
from runner.journal import JOURNAL
from runner.process import has_exited, kill_cgroup, kill_marked, kill_tree, wait_exited
from runner.proctree import cgroup_parent
from runner.rundir import remove_run_dir, stray_runs
from runner.spare import SUPERVISOR
from runner.supervision import SUPERVISOR_KILL_S

log = logging.getLogger(__name__)

SWEEP_GRACE_S = 2.0
"""The marker sweep's grace between SIGTERM and SIGKILL."""
DEFAULT_GRACE_S = 30.0
"""An old supervisor's grace period when its command line does not tell."""

_PROC = Path("/proc")
SUPERVISOR_NAME = f"/{SUPERVISOR.name}".encode()
STANDBY_OPTION = b"--standby"
"""A supervisor started as a spare (runner/spare.py) has it among its options."""


class _OldSupervisor:
    """A previous bridge's supervisor of a run, pinned by a pidfd."""

    def __init__(self, pid: int, fd: int, grace_s: float) -> None:
        self.pid = pid
        self.fd = fd
        self.grace_s = grace_s


async def recover_run(run_id: str, cgroup_root: str) -> int:
    """Make sure nothing of run ``run_id`` is left; return how many processes were killed.

    ``cgroup_root`` is the ``[runner] cgroup_root`` setting: the run's group,
    if it had one, is ``<parent>/<run_id>`` (as the supervisor makes it).
    """
    killed = 0
    supervisor = await _find_supervisor(run_id)
    if supervisor is not None:
        try:
            # A stop signal is a stop for every version of the supervisor: the
            # same TERM, grace and KILL as any other stop of the run.
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(supervisor.fd, signal.SIGTERM)
            if not await _exited(supervisor.fd, supervisor.grace_s + SUPERVISOR_KILL_S):
                log.error(
                    "run %s: its old supervisor %d did not finish its stop; killing its tree",
                    run_id, supervisor.pid,
                )  # fmt: skip
                killed += await kill_tree(supervisor.fd, supervisor.pid)
        finally:
            os.close(supervisor.fd)
    path = _cgroup_path(run_id, cgroup_root)
    if path:
        killed += await kill_cgroup(path)
    killed += await kill_marked(run_id, SWEEP_GRACE_S)
    return killed


async def clean_stray_runs(state_dir: Path, known: set[str], cgroup_root: str = "off") -> int:
    """Stop and remove the runs under ``state_dir`` whose id is not in ``known``.

    For start-up: a run directory no registry row names belongs to no room
    (a crash between spawn and registration, or its outcome was recorded and
    only the removal was lost). Its run is stopped with :func:`recover_run`
    if anything of it is left; then the directory goes. Returns how many
    processes were killed.
    """
    killed = 0
    for run_dir in stray_runs(state_dir, known):
        killed += await recover_run(run_dir.name, cgroup_root)
        remove_run_dir(run_dir)
    return killed


def _cgroup_path(run_id: str, cgroup_root: str) -> str:
    if cgroup_root == "off":
        return ""
    try:
        return os.path.join(cgroup_parent(cgroup_root), run_id)
    except OSError:
        return ""  # no cgroup v2 here: the run had no group either


async def _find_supervisor(run_id: str) -> _OldSupervisor | None:
    """The live supervisor of ``run_id`` (by its marker and command line), pinned.

    The scan runs in a worker thread and returns candidates only: pidfds are
    opened here, so a cancelled recovery never leaves one open.
    """
    for pid, argv in await asyncio.to_thread(_supervisor_candidates, run_id):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        # Pinned: check it is still the same process (not a recycled pid).
        with contextlib.suppress(OSError):
            if (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0") == argv:
                return _OldSupervisor(pid, fd, _grace(pid, argv))
        os.close(fd)
    return None


def _supervisor_candidates(run_id: str) -> list[tuple[int, list[bytes]]]:
    """Pids and command lines of processes that look like ``run_id``'s supervisor.

    One started for its run has the run's marker in its environment and the
    run's id on its command line; a spare (runner/spare.py) has neither, and
    works in the run's directory, named by the run's id. Blocking (reads
    every process of the host in /proc): a worker thread's job.
    """
    marker = f"{MARKER_ENV}={run_id}".encode()
    option = f"--run-id={run_id}".encode()
    found: list[tuple[int, list[bytes]]] = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if _supervises(argv, STANDBY_OPTION):
                # Its cwd is the run directory, "(deleted)" once that is removed.
                works_in = os.readlink(entry / "cwd").removesuffix(" (deleted)")
                if os.path.basename(works_in) == run_id:
                    found.append((int(entry.name), argv))
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ and _supervises(argv, option):
            found.append((int(entry.name), argv))
    return found


def _supervises(argv: list[bytes], option: bytes) -> bool:
    """Whether ``argv`` is a supervisor's with ``option`` among its own options.

    By file name, not full path: the previous bridge may have run from
    another installation.
    """
    own = argv[: argv.index(b"--")] if b"--" in argv else argv
    return option in own and any(a.endswith(SUPERVISOR_NAME) for a in own)


def _grace(pid: int, argv: list[bytes]) -> float:
    """The old supervisor's grace period: from its command line, or for one that was a
    spare (whose command line has none) from its journal's ``hello``."""
    if _supervises(argv, STANDBY_OPTION):
        try:
            with open(_PROC / str(pid) / "cwd" / JOURNAL, "rb") as f:
                grace = json.loads(f.readline()).get("grace_s")
        except (OSError, ValueError, AttributeError):
            grace = None
        valid = isinstance(grace, int | float) and not isinstance(grace, bool) and grace >= 0
        return float(grace) if valid else DEFAULT_GRACE_S
    for arg in argv:
        if arg.startswith(b"--grace-s="):
            with contextlib.suppress(ValueError):
                return float(arg.partition(b"=")[2])
    return DEFAULT_GRACE_S


async def _exited(pidfd: int, within: float) -> bool:
    """Wait up to ``within`` s for the process behind ``pidfd`` to exit; whether it did."""
    return has_exited(pidfd) or not await wait_exited([pidfd], within)

"""The bridge's /proc scans (marker sweep, a frozen supervisor's tree, recovery's
search for an old supervisor) run in a worker thread: the event loop keeps
serving while one is under way.

Each scan is wrapped so that it goes on only once the event loop has run a
callback scheduled from inside it. A scan in a worker thread gets that at
once; a scan on the loop's own thread would wait for it in vain (the loop is
blocked in the scan) until the wrapper gives up, which the test reports.
The real scan still does the work, against real processes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

import runner.process
import runner.recovery
from bridge.core.model import RunId
from runner import kill_marked, recover_run
from runner.process import kill_tree
from tests.runner.conftest import is_alive, pids_with_marker
from tests.runner.orphans import leave_orphans

pytestmark = pytest.mark.slow

GIVE_UP_S = 10.0
"""How long a wrapped scan waits for the loop before it counts as run on the loop."""


class LoopMustRun:
    """Wraps a blocking scan; records, per call, whether the loop ran meanwhile."""

    def __init__(self, scan: Callable[..., Any]) -> None:
        self._scan = scan
        self._loop = asyncio.get_running_loop()
        self.loop_ran: list[bool] = []

    @property
    def off_loop(self) -> bool:
        """It scanned at least once, and the loop ran during every scan."""
        return bool(self.loop_ran) and all(self.loop_ran)

    def __call__(self, *args: Any) -> Any:
        served = threading.Event()
        self._loop.call_soon_threadsafe(served.set)
        self.loop_ran.append(served.wait(GIVE_UP_S))
        return self._scan(*args)


def wrap(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> LoopMustRun:
    wrapped = LoopMustRun(getattr(module, name))
    monkeypatch.setattr(module, name, wrapped)
    return wrapped


async def test_the_marker_sweep_scans_off_the_loop(
    run_id: RunId, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans = wrap(monkeypatch, runner.process, "find_marked")
    pids = await leave_orphans(run_id)

    killed = await kill_marked(run_id, grace_s=0.3)

    assert scans.off_loop, scans.loop_ran
    assert killed == 2
    assert not any(is_alive(pid) for pid in pids)


async def test_a_frozen_supervisors_tree_is_scanned_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scans = wrap(monkeypatch, runner.process, "descendants")
    # A stand-in for a stuck supervisor: a shell with a child of its own.
    shell = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        'sleep 300 & echo "$!"; wait',
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
    )
    assert shell.stdout is not None
    child = int(await shell.stdout.readline())
    pidfd = os.pidfd_open(shell.pid)
    try:
        assert await kill_tree(pidfd, shell.pid) == 1
    finally:
        os.close(pidfd)
    assert await shell.wait() == -signal.SIGKILL
    assert not is_alive(child)
    assert scans.off_loop, scans.loop_ran


async def test_recovery_scans_off_the_loop(run_id: RunId, monkeypatch: pytest.MonkeyPatch) -> None:
    supervisor_scans = wrap(monkeypatch, runner.recovery, "_supervisor_candidates")
    marker_scans = wrap(monkeypatch, runner.process, "find_marked")
    pids = await leave_orphans(run_id)

    assert await recover_run(run_id, "off") == 2

    assert pids_with_marker(run_id) == []
    assert not any(is_alive(pid) for pid in pids)
    assert supervisor_scans.loop_ran == [True]
    assert marker_scans.off_loop, marker_scans.loop_ran

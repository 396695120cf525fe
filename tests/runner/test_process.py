"""The marker sweep against real processes that are not our children."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from bridge.core.model import RunId
from runner import MARKER_ENV, find_marked, kill_marked
from tests.runner.conftest import is_alive, pids_with_marker

pytestmark = pytest.mark.slow

IGNORES_TERM = (
    "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); os.close(1); time.sleep(300)"
)


async def leave_orphans(run_id: RunId) -> list[int]:
    """Start, as a crashed run would leave them, a sleeper and a TERM-ignoring process.

    A shell starts both in the background and exits, so they are orphans in
    their own session, not children of the test.
    """
    shell = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        'sleep 300 >/dev/null & echo "$!"; "$PY" -c "$CODE" & echo "$!"',
        env={**os.environ, MARKER_ENV: run_id, "PY": sys.executable, "CODE": IGNORES_TERM},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert shell.stdout is not None
    pids = [int(await shell.stdout.readline()), int(await shell.stdout.readline())]
    assert await shell.stdout.readline() == b"ready\n"  # the TERM handler is in place
    assert await shell.stdout.read() == b""  # nothing holds the pipe any more
    assert await shell.wait() == 0
    return pids


async def test_kill_marked_sweeps_leftovers_of_a_previous_run(run_id: RunId) -> None:
    pids = await leave_orphans(run_id)
    other = RunId(f"{run_id}-other")
    bystanders = await leave_orphans(other)
    try:
        assert sorted(pids_with_marker(run_id)) == sorted(pids)
        assert sorted(find_marked(run_id)) == sorted(pids)

        killed = await kill_marked(run_id, grace_s=0.3)

        assert killed == 2
        assert pids_with_marker(run_id) == []
        assert not any(is_alive(pid) for pid in pids)
        # Another run's processes (a marker that merely starts the same) are untouched.
        assert all(is_alive(pid) for pid in bystanders)
    finally:
        await kill_marked(other, grace_s=0)
    assert pids_with_marker(other) == []


async def test_kill_marked_with_nothing_to_kill(run_id: RunId) -> None:
    assert await kill_marked(run_id, grace_s=1.0) == 0


async def test_kill_marked_without_grace_kills_at_once(run_id: RunId) -> None:
    pids = await leave_orphans(run_id)
    assert await kill_marked(run_id, grace_s=0) == 2
    assert not any(is_alive(pid) for pid in pids)


def test_empty_marker_is_refused() -> None:
    with pytest.raises(ValueError, match="empty marker"):
        find_marked("")

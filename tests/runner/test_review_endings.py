"""Review of issue 25's endings, in the runner: a run cut by a time limit and stopped
while claude has its grace period to print the interrupted turn's result; a run no
bridge attached to, ended by its supervisor (the real supervisor, the fake claude)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import attach_claude, run_claude
from runner.journal import JOURNAL
from runner.rundir import RUNS
from tests.runner.conftest import Recorder, pids_with_marker
from tests.runner.containment import until_exited
from tests.runner.detached_runs import detached, waiting_request
from tests.runner.fake_runs import fake_env, make_request, record

pytestmark = pytest.mark.slow

WAIT_S = 30.0


async def until_expired(journal: Path) -> None:
    """The supervisor journaled the time limit (and interrupted claude)."""
    while not journal.exists() or b'"t":"expired"' not in journal.read_bytes():
        await asyncio.sleep(0.05)


async def test_a_stop_during_a_time_limits_grace_leaves_no_claude_behind(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # claude does not end its turn at the limit's SIGINT: the grace period runs, and a
    # !stop (or a shutdown) then cancels the run. Returned, it must have left nothing
    # running: the room's next run would be a second claude of the conversation.
    state = tmp_path / "state"
    request = make_request(
        run_id,
        tmp_path,
        env=fake_env(tmp_path, sleep="60", ignore_int="1"),
        run_timeout_s=1,
        stop_grace_s=5.0,
        state_dir=state,
    )
    async with asyncio.timeout(WAIT_S):
        running = asyncio.create_task(run_claude(request, recorder))
        await until_expired(state / RUNS / run_id / JOURNAL)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    assert pids_with_marker(run_id) == []


async def test_a_run_stopped_for_want_of_a_bridge_reports_what_claude_spent(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # No bridge attached for orphan_timeout_s: the supervisor ends the run as at its
    # other limits, claude interrupted first, so the bridge that reattaches later
    # reads the cost of the interrupted turn (SIGTERM alone prints no result: unknown).
    request = replace(waiting_request(run_id, tmp_path, orphan_timeout_s=1.0), stop_grace_s=5.0)
    live = await detached(request, recorder)
    run = record(tmp_path)
    async with asyncio.timeout(WAIT_S):
        await until_exited([live.supervisor_pid, run["pid"]])
    report = await attach_claude(request, live, Recorder())
    assert report.status is RunStatus.INTERRUPTED
    assert "no chatbridge was attached to it for 1 s" in report.error
    assert report.cost_usd is not None

"""Review of issue 25's endings, in the runner: a run cut by a time limit and stopped
while claude has its grace period to print the interrupted turn's result (the real
supervisor, the fake claude)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.core.model import RunId
from runner import run_claude
from runner.journal import JOURNAL
from runner.rundir import RUNS
from tests.runner.conftest import Recorder, pids_with_marker
from tests.runner.test_run_fake import fake_env, make_request

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

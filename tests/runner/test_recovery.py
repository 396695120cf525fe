"""After a crash of the bridge, for a run it will not attach to again:
``recover_run`` asks the old supervisor to stop its run (never killing it
mid-stop) and leaves nothing of the run.

The "bridge" is a child process running ``run_claude``; it is killed with
SIGKILL, as a crash or ``kill -9`` would.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bridge.core.model import RunId
from runner import RunRequest, recover_run
from tests.runner.containment import HERE, alive, escaping_request, run_in_child_bridge

pytestmark = pytest.mark.slow


async def crash_during(
    request: RunRequest, tmp_path: Path, *, with_supervisor: bool = False
) -> list[int]:
    """Start the run in a child "bridge", kill it once the tools run; return the run's pids.

    The tools ignore SIGTERM (inherited from claude). ``with_supervisor``: the
    supervisor is killed too (the run's processes are left to their own).
    """
    bridge, pids = await run_in_child_bridge(request, tmp_path)
    if with_supervisor:
        os.kill(pids[1], signal.SIGKILL)
    bridge.send_signal(signal.SIGKILL)
    await bridge.wait()
    return pids


async def test_recovery_has_the_old_supervisor_stop_its_run(run_id: RunId, tmp_path: Path) -> None:
    # The run outlives the crashed bridge. claude ignores SIGTERM: the old
    # supervisor needs its whole grace period and SIGKILL. Killed mid-stop (it
    # carries the marker), it would leave the tools that cleared their
    # environment to init.
    request = escaping_request(run_id, tmp_path, sleep="300", ignore_term="1")
    request = RunRequest(**{**request.__dict__, "stop_grace_s": 3.0})
    pids = await crash_during(request, tmp_path)

    await recover_run(run_id, "off")  # restarted at once
    assert alive(pids) == []


@pytest.mark.skipif(not HERE.groups, reason=f"no cgroup groups: {HERE.problem}")
async def test_recovery_kills_the_run_cgroup_when_its_supervisor_died_too(
    run_id: RunId, tmp_path: Path
) -> None:
    request = escaping_request(run_id, tmp_path, sleep="300", ignore_term="1")
    request = RunRequest(**{**request.__dict__, "cgroup_parent": "auto", "stop_grace_s": 3.0})
    pids = await crash_during(request, tmp_path, with_supervisor=True)

    await recover_run(run_id, "auto")
    assert alive(pids) == []
    assert not (Path(HERE.parent) / run_id).exists()

"""Nothing escapes a run: tools that clear their environment, double-fork or
background themselves are gone after a stop, a timeout, a normal end, and
after the process running the run is killed with SIGKILL.

The escaping processes carry no marker, so these tests follow them by pid
(the fake claude writes them to files) and wait on pidfds, never on a scan.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import RunRequest, ToolResult, run_claude
from runner.proctree import own_cgroup
from tests.fakes.fake_claude import FAKE_CLAUDE
from tests.runner.conftest import Recorder
from tests.runner.containment import (
    CGROUP_PARENTS,
    alive,
    escaped,
    escaping_request,
    needs_cgroups,
    ppid,
    run_in_child_bridge,
    until_exited,
)
from tests.runner.fake_runs import fake_env, make_request, record

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("cgroup_parent", CGROUP_PARENTS)
async def test_escaping_tools_are_stopped_with_the_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder, cgroup_parent: str
) -> None:
    task = asyncio.create_task(
        run_claude(escaping_request(run_id, tmp_path, cgroup_parent, sleep="300"), recorder)
    )
    await recorder.wait_for(ToolResult)  # the escapes started before the first line
    pids = escaped(tmp_path)
    assert alive(pids) == pids
    # None of them can be found by the environment marker.
    for pid in pids:
        assert b"CHATBRIDGE_RUN_MARKER" not in Path(f"/proc/{pid}/environ").read_bytes()

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert alive([record(tmp_path)["pid"], *pids]) == []


@pytest.mark.parametrize("cgroup_parent", CGROUP_PARENTS)
async def test_escaping_tools_are_stopped_at_the_time_limit(
    run_id: RunId, tmp_path: Path, recorder: Recorder, cgroup_parent: str
) -> None:
    request = escaping_request(run_id, tmp_path, cgroup_parent, sleep="300")
    report = await run_claude(RunRequest(**{**request.__dict__, "run_timeout_s": 3.0}), recorder)
    assert report.status is RunStatus.TIMED_OUT
    assert alive([record(tmp_path)["pid"], *escaped(tmp_path)]) == []


@pytest.mark.parametrize("cgroup_parent", CGROUP_PARENTS)
async def test_escaping_tools_end_with_a_normal_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder, cgroup_parent: str
) -> None:
    # claude prints its result and exits 0, leaving its tools running.
    report = await run_claude(escaping_request(run_id, tmp_path, cgroup_parent), recorder)
    assert report.status is RunStatus.SUCCEEDED
    assert report.exit_code == 0
    assert alive(escaped(tmp_path)) == []


async def test_orphans_are_reaped_during_the_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # The double fork's middle process exits at once: an orphan that re-parents
    # to the supervisor and must not stay a zombie while the run goes on.
    task = asyncio.create_task(
        run_claude(escaping_request(run_id, tmp_path, sleep="300"), recorder)
    )
    try:
        await recorder.wait_for(ToolResult)
        supervisor = ppid(record(tmp_path)["pid"])
        # The re-parented orphans are the supervisor's children now.
        assert ppid(escaped(tmp_path)[1]) == supervisor

        def zombies() -> list[int]:
            found = []
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        state, parent = (
                            entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[:2]
                        )
                    except OSError:
                        continue
                    if parent == str(supervisor) and state == "Z":
                        found.append(int(entry.name))
            return found

        # Reaping follows SIGCHLD asynchronously: poll the other process's state.
        async with asyncio.timeout(10):
            while zombies():
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_kill_9_of_the_bridge_leaves_the_run_to_its_orphan_timeout(
    run_id: RunId, tmp_path: Path
) -> None:
    request = escaping_request(run_id, tmp_path, sleep="300", ignore_term="1")
    request = RunRequest(**{**request.__dict__, "orphan_timeout_s": 3.0})
    bridge, pids = await run_in_child_bridge(request, tmp_path)
    assert alive(pids) == pids

    bridge.send_signal(signal.SIGKILL)
    await bridge.wait()
    # The run is detached from the bridge: it goes on (a restarted bridge would
    # attach again) ...
    assert alive(pids) == pids
    # ... until no bridge came for the orphan timeout: then the supervisor stops
    # it by itself (claude ignores SIGTERM here: the grace period and SIGKILL).
    await until_exited(pids)
    assert alive(pids) == []


@needs_cgroups
async def test_a_tool_that_left_the_runs_cgroup_still_gets_the_stop_signal(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    """Root can move a process out of the run's group: the supervisor's SIGTERM
    reaches it all the same (it is still a descendant), not only the kill phase."""
    told, started = tmp_path / "told", tmp_path / "started"
    os.mkfifo(started)
    tool = (
        f"echo $$ > {own_cgroup()}/cgroup.procs; "
        f'trap "echo TERM > {told}; exit 0" TERM; echo $$ > {started}; '
        "while :; do sleep 0.05; done"
    )
    wrapper = tmp_path / "claude-with-tool"
    wrapper.write_text(
        f"#!/bin/sh\nsh -c '{tool}' </dev/null >/dev/null 2>&1 &\n"
        f'exec "{sys.executable}" "{FAKE_CLAUDE}" "$@"\n'
    )
    wrapper.chmod(0o755)
    request = make_request(
        run_id,
        tmp_path,
        claude_bin=str(wrapper),
        env=fake_env(tmp_path, sleep="300"),
        stop_grace_s=30.0,  # far longer than the test: only the SIGTERM can end the tool in time
        cgroup_parent="auto",
    )
    task = asyncio.create_task(run_claude(request, recorder))
    # The FIFO's open blocks until the tool has left the group and writes its pid.
    pid = int(await asyncio.to_thread(started.read_text))
    assert run_id not in Path(f"/proc/{pid}/cgroup").read_text()  # out of the run's group
    await recorder.wait_for(ToolResult)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert told.read_text().strip() == "TERM"
    assert alive([pid]) == []

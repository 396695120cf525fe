"""The supervisor itself killed or stopped (a tool, ``pkill -9 python``, the
OOM killer): the bridge notices at once (or, frozen, by its backstop), stops
the run by itself and reports it honestly; a run whose stdout nobody reads
any more still ends cleanly.

The processes are followed by pid (the fake claude records them) and waited
for through the run's own end, never a sleep.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import Result, ToolResult, run_claude
from tests.runner.conftest import Recorder
from tests.runner.containment import (
    CGROUP_PARENTS,
    alive,
    escaped,
    escaping_request,
    needs_cgroups,
    ppid,
)
from tests.runner.fake_runs import fake_env, make_request, record

pytestmark = pytest.mark.slow


def supervisor(tmp_path: Path) -> int:
    return ppid(record(tmp_path)["pid"])


@pytest.mark.parametrize("cgroup_parent", CGROUP_PARENTS)
async def test_a_killed_supervisor_ends_the_run_and_its_processes(
    run_id: RunId, tmp_path: Path, recorder: Recorder, cgroup_parent: str
) -> None:
    env = fake_env(tmp_path, sleep="300", grandchild="1", background="1")
    request = make_request(
        run_id, tmp_path, env=env, cgroup_parent=cgroup_parent, idle_timeout_s=30, run_timeout_s=30
    )
    task = asyncio.create_task(run_claude(request, recorder))
    await recorder.wait_for(ToolResult)
    run = record(tmp_path)
    os.kill(supervisor(tmp_path), signal.SIGKILL)

    report = await task
    # Promptly and as what it is: not a stall or a timeout long after.
    assert report.status is RunStatus.FAILED
    assert "supervisor was killed" in report.error
    assert alive([run["pid"], *run["children"]]) == []


@needs_cgroups
async def test_the_cgroup_catches_what_escaped_a_killed_supervisor(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # env -i, a daemon, a background child: no marker, and with the supervisor
    # gone no parent link leads to them; the run's cgroup still holds them.
    request = escaping_request(run_id, tmp_path, sleep="300")
    request = type(request)(**{**request.__dict__, "cgroup_parent": "auto"})
    task = asyncio.create_task(run_claude(request, recorder))
    await recorder.wait_for(ToolResult)
    pids = [record(tmp_path)["pid"], *escaped(tmp_path)]
    os.kill(supervisor(tmp_path), signal.SIGKILL)

    report = await task
    assert report.status is RunStatus.FAILED
    assert alive(pids) == []


async def test_a_result_before_the_supervisor_died_still_counts(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    env = fake_env(tmp_path, no_tool="1", linger="300", background="1")
    task = asyncio.create_task(run_claude(make_request(run_id, tmp_path, env=env), recorder))
    await recorder.wait_for(Result)
    run = record(tmp_path)
    os.kill(supervisor(tmp_path), signal.SIGKILL)

    report = await task
    assert report.status is RunStatus.SUCCEEDED
    assert report.result_text
    # The answer was given, but claude lingered: the bridge stopped it anyway.
    assert alive([run["pid"], *run["children"]]) == []


async def test_a_stopped_supervisor_is_replaced_and_nothing_escapes(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # No cgroup: the tools cleared their environment, so only the parent links
    # to the (frozen) supervisor lead to them.
    task = asyncio.create_task(
        run_claude(escaping_request(run_id, tmp_path, sleep="300"), recorder)
    )
    await recorder.wait_for(ToolResult)
    pids = [record(tmp_path)["pid"], *escaped(tmp_path)]
    os.kill(supervisor(tmp_path), signal.SIGSTOP)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert alive(pids) == []


async def test_output_after_the_result_is_drained_without_a_false_alarm(
    run_id: RunId, tmp_path: Path, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    # A background tool that ignores SIGTERM writes 2 MB to claude's stdout
    # once claude exited after its result: nobody decodes it any more, but it
    # must still be read, or the tool blocks and the pipe never ends.
    env = fake_env(tmp_path, no_tool="1", write_after_exit=str(2 * 1024 * 1024))
    caplog.set_level(logging.WARNING, logger="runner")
    report = await run_claude(make_request(run_id, tmp_path, env=env, stop_grace_s=0.5), recorder)

    assert report.status is RunStatus.SUCCEEDED
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert alive(record(tmp_path)["children"]) == []


async def test_a_frozen_supervisor_is_caught_by_the_bridges_backstop(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # The supervisor keeps the time limits; frozen, it cannot. The bridge's
    # coarse backstop (time limit + grace + kill phase) stops the run itself.
    env = fake_env(tmp_path, sleep="300", grandchild="1")
    request = make_request(run_id, tmp_path, env=env, run_timeout_s=1.0, stop_grace_s=0.2)
    task = asyncio.create_task(run_claude(request, recorder))
    await recorder.wait_for(ToolResult)
    run = record(tmp_path)
    os.kill(supervisor(tmp_path), signal.SIGSTOP)

    report = await task
    assert report.status is RunStatus.FAILED
    assert "supervisor stopped responding" in report.error
    assert alive([run["pid"], *run["children"]]) == []

"""cgroup v2 groups per run: the start-up probe; a run in its own group where the host allows."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from bridge.config import RoomDefaults, Settings
from bridge.core.model import RunId, RunStatus
from bridge.host.containment import report_containment
from runner import ToolResult, run_claude
from runner.cgroups import probe
from runner.proctree import own_cgroup
from tests.runner.conftest import Recorder, is_alive
from tests.runner.containment import HERE
from tests.runner.fake_runs import fake_env, make_request, record


def test_off_means_no_group() -> None:
    support = probe("off", limits=True)
    assert not support.groups
    assert "off" in support.problem


def test_a_root_that_cannot_hold_groups(tmp_path: Path) -> None:
    support = probe(str(tmp_path / "missing"), limits=False)
    assert not support.groups
    assert "cannot create a group" in support.problem


@pytest.mark.parametrize(
    ("text", "size"), [("512M", 512 << 20), ("2G", 2 << 30), ("1GiB", 1 << 30)]
)
def test_memory_sizes(text: str, size: int) -> None:
    assert RoomDefaults(memory_max=text).memory_max == size


def test_limits_that_cannot_be_applied_are_an_error_at_start_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(
        runner={"cgroup_root": str(tmp_path / "missing")}, defaults={"pids_max": 100}
    )
    with caplog.at_level(logging.INFO):
        support = report_containment(settings)
    assert not support.limits
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "[defaults]" in errors[0]
    assert "cannot be applied" in errors[0]


@pytest.mark.slow
@pytest.mark.skipif(not HERE.groups, reason=f"no cgroup v2 groups here: {HERE.problem}")
async def test_a_run_gets_its_own_group_and_removes_it(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    escape = tmp_path / "escape"
    escape.mkdir()
    request = make_request(
        run_id,
        tmp_path,
        env=fake_env(tmp_path, sleep="300", escape=str(escape)),
        stop_grace_s=0.5,
        cgroup_parent="auto",
    )
    task = asyncio.create_task(run_claude(request, recorder))
    await recorder.wait_for(ToolResult)
    group = Path(own_cgroup()) / run_id
    members = {int(p) for p in (group / "cgroup.procs").read_text().split()}
    rec = record(tmp_path)
    assert {rec["pid"], *rec["escaped"]} <= members
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not any(is_alive(p) for p in [rec["pid"], *rec["escaped"]])
    assert not group.exists()


@pytest.mark.slow
async def test_limits_without_controllers_still_run_contained(
    run_id: RunId, tmp_path: Path, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    if probe("auto", limits=True).limits:
        pytest.skip("this host can apply limits")
    request = make_request(
        run_id, tmp_path, env=fake_env(tmp_path), cgroup_parent="auto", pids_max=50
    )
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.SUCCEEDED
    assert "has no cgroup of its own" in caplog.text
    assert json.loads((tmp_path / "record.json").read_text())["pid"]

"""Runs outlive the bridge: the real ``chatbridge`` process killed or stopped during a run.

A run's supervisor goes on without the bridge; the next start reattaches to
it through the registry of live runs and the room gets the answer once. The
fake claude waits for a trigger file before it answers, so each test decides
when a run ends. After every test no process of any run survives (checked by
marker).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from runner.process import find_marked
from tests.bridge.bridge_process import Bridge, run_pids, wait_rows
from tests.bridge.detached_runs import finished_claudes, started_run, supervisor_pid, waiting
from tests.bridge.harness import rows, write_config
from tests.config_files import Table
from tests.runner.containment import alive, until_exited

pytestmark = pytest.mark.slow


async def running(tmp_path: Path, config: Table | None = None) -> tuple[Bridge, str, list[int]]:
    """A bridge with a run in flight (waiting for ``go``): the bridge, the run, its pids."""
    bridge = Bridge(write_config(tmp_path, config, env=waiting(tmp_path)))
    await bridge.start()
    run_id = await started_run(bridge, tmp_path)
    return bridge, run_id, run_pids(tmp_path)


@pytest.mark.usefixtures("no_leftovers")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
async def test_the_same_claude_answers_once_after_a_restart(
    tmp_path: Path, how: signal.Signals
) -> None:
    config = write_config(
        tmp_path, env=waiting(tmp_path, FAKE_CLAUDE_THEN_TOOL="echo after the restart")
    )
    bridge = Bridge(config)
    await bridge.start()
    run_id = await started_run(bridge, tmp_path)
    pids = run_pids(tmp_path)
    bridge.send("queued one")
    bridge.send("queued two")
    await wait_rows(
        tmp_path,
        "select text from messages where state = 'pending' order by id",
        [("queued one",), ("queued two",)],
    )
    bridge.signal(how)
    code = await bridge.exit_code()
    assert code == (0 if how == signal.SIGTERM else -signal.SIGKILL)
    # The run goes on without the bridge: claude and its tools are still there.
    assert alive(pids) == pids
    assert "long job" not in bridge.out.splitlines()
    if how == signal.SIGTERM:  # (a killed bridge cannot say it)
        assert "· Left running at a restart after" in bridge.out

    again = Bridge(config)
    await again.start()
    (tmp_path / "go").touch()
    # Progress goes on after the restart: the run's next tool use is shown.
    await again.wait_for("Bash: echo after the restart")
    (tmp_path / "go.2").touch()
    await again.wait_for("local wrote:\n> queued one\n\nlocal wrote:\n> queued two")
    assert await again.end_input() == 0

    # The same claude process answered, once; the waiting messages became one
    # follow-up batch after it.
    assert finished_claudes(tmp_path) == [
        "long job",
        "local wrote:\n> queued one\n\nlocal wrote:\n> queued two",
    ]
    assert again.out.splitlines().count("long job") == 1
    # What the room was shown before the restart is not shown again.
    assert "Bash: echo hello" not in again.out.split("long job")[0]
    assert rows(tmp_path, "select id, status from runs order by started_at")[0] == (
        run_id,
        "succeeded",
    )
    assert [r[0] for r in rows(tmp_path, "select status from runs")] == ["succeeded"] * 2
    assert rows(tmp_path, "select count(*) from live_runs") == [(0,)]
    assert not (tmp_path / "state" / "runs" / run_id).exists()
    assert alive(pids) == []


@pytest.mark.usefixtures("no_leftovers")
async def test_stop_after_a_reattach_stops_the_whole_tree(tmp_path: Path) -> None:
    bridge, run_id, pids = await running(tmp_path)
    config = bridge.config
    bridge.signal(signal.SIGKILL)
    await bridge.exit_code()

    again = Bridge(config)
    await again.start()
    await wait_rows(tmp_path, "select count(*) from runs where status = 'running'", [(1,)])
    again.send("!status")
    await again.wait_for(run_id)
    again.send("!stop")
    await again.wait_for("Stopped")
    assert alive(pids) == []
    assert find_marked(run_id) == []
    assert await again.end_input() == 0
    assert rows(tmp_path, "select status from runs") == [("stopped",)]
    # A stop interrupts claude's turn and lets it exit on its own (its session stays
    # resumable, docs/live-runs.md): it ends, but with no answer for the room.
    assert finished_claudes(tmp_path) in ([], ["long job"])
    assert "Done." not in again.out


@pytest.mark.usefixtures("no_leftovers")
async def test_a_time_limit_that_passes_while_the_bridge_is_down_is_told_after_the_restart(
    tmp_path: Path,
) -> None:
    bridge, run_id, pids = await running(tmp_path, {"defaults": {"run_timeout_s": 3}})
    config = bridge.config
    bridge.signal(signal.SIGKILL)
    await bridge.exit_code()
    # The supervisor keeps the limit alone: the run is stopped with nobody attached.
    await until_exited(pids)

    again = Bridge(config)
    await again.start()
    await again.wait_for("The run was stopped after its time limit of 3s.")
    assert await again.end_input() == 0
    assert again.out.count("time limit") == 1
    assert rows(tmp_path, "select status from runs") == [("timed_out",)]
    assert find_marked(run_id) == []


@pytest.mark.usefixtures("no_leftovers")
async def test_a_bridge_that_never_comes_back_leaves_no_runaway_agent(tmp_path: Path) -> None:
    bridge, run_id, pids = await running(tmp_path, {"runner": {"orphan_timeout_s": 1}})
    supervisor = supervisor_pid(tmp_path)
    bridge.signal(signal.SIGKILL)
    await bridge.exit_code()
    await until_exited([*pids, supervisor])
    assert find_marked(run_id) == []


@pytest.mark.usefixtures("no_leftovers")
async def test_a_killed_supervisor_interrupts_the_run_and_its_tree_is_swept(
    tmp_path: Path,
) -> None:
    bridge, run_id, pids = await running(tmp_path)
    os.kill(supervisor_pid(tmp_path), signal.SIGKILL)
    await bridge.wait_for(f"`!retry {run_id}` runs it again.")
    assert alive(pids) == []
    assert find_marked(run_id) == []
    assert await bridge.end_input() == 0
    assert rows(tmp_path, "select status from runs") == [("failed",)]


@pytest.mark.usefixtures("no_leftovers")
async def test_a_supervisor_killed_while_the_bridge_was_down_is_reported_interrupted(
    tmp_path: Path,
) -> None:
    bridge, run_id, pids = await running(tmp_path)
    config = bridge.config
    supervisor = supervisor_pid(tmp_path)
    bridge.signal(signal.SIGKILL)
    await bridge.exit_code()
    os.kill(supervisor, signal.SIGKILL)
    await until_exited([supervisor])

    write_config(tmp_path)  # the same configuration, now with a claude that answers
    again = Bridge(config)
    await again.start()
    await again.wait_for(f"`!retry {run_id}` runs it again.")
    assert await again.end_input() == 0
    assert alive(pids) == []
    assert rows(tmp_path, "select status from runs") == [("interrupted",)]
    assert rows(tmp_path, "select count(*) from live_runs") == [(0,)]
    assert not (tmp_path / "state" / "runs" / run_id).exists()


@pytest.mark.usefixtures("no_leftovers")
async def test_a_reset_answered_before_the_restart_is_not_undone_by_the_run(
    tmp_path: Path,
) -> None:
    env = waiting(tmp_path, FAKE_CLAUDE_SESSIONS_DIR=str(tmp_path / "sessions"))
    config = write_config(tmp_path, env=env)
    bridge = Bridge(config)
    await bridge.start()
    await started_run(bridge, tmp_path)
    bridge.send("!reset")
    await bridge.wait_for("The next run starts a new Claude session.")
    bridge.signal(signal.SIGTERM)
    assert await bridge.exit_code() == 0

    again = Bridge(config)
    await again.start()
    (tmp_path / "go").touch()
    await again.wait_for("\nlong job\n")
    again.send("!status")
    await again.wait_for("Session:")
    assert await again.end_input() == 0
    assert "Session: none (next run starts fresh)." in again.out


async def test_a_second_bridge_on_the_same_state_dir_refuses_to_start(tmp_path: Path) -> None:
    # Each would take the other's runs (and their supervisors' connections).
    config = write_config(tmp_path)
    first = Bridge(config)
    await first.start()
    assert first.proc is not None
    lock = tmp_path / "state" / "lock"
    # Another process writes it: no event to wait on, only its state.
    async with asyncio.timeout(30):
        while not (lock.exists() and lock.read_text().strip() == str(first.proc.pid)):
            await asyncio.sleep(0.05)
    second = Bridge(config)
    await second.start()
    assert await second.exit_code() == 1
    errors = await second.stderr()
    assert f"runner.state_dir: {tmp_path / 'state'} is in use by another chatbridge" in errors
    assert "Traceback" not in errors
    assert await first.end_input() == 0

"""Spare supervisors (runner/spare.py): a run's supervisor started before its run.

Real processes: the supervisor started as a spare, the fake claude under it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import MARKER_ENV, Spares, Spawned, run_claude
from runner.recovery import _supervisor_candidates, recover_run
from runner.spare import Spare, start_spare
from tests.runner.conftest import Recorder, exit_of, is_alive
from tests.runner.fake_runs import assert_nothing_left, fake_env, make_request, record

pytestmark = pytest.mark.slow


def environ_of(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


async def exited(spare: Spare) -> int:
    """The spare's exit status, once it exits on its own."""
    pidfd = os.pidfd_open(spare.proc.pid)
    try:
        await exit_of(pidfd)
    finally:
        os.close(pidfd)
    return spare.proc.wait()


async def test_a_run_takes_the_ready_spare_as_its_supervisor(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    spares = Spares()
    spares.refill()
    ready = spares._ready
    assert ready is not None
    spare_pid = ready.proc.pid
    # Waiting for its orders, it holds nothing of the bridge's environment.
    assert [e for e in environ_of(spare_pid) if e] == []

    request = make_request(run_id, tmp_path, env=fake_env(tmp_path, echo="1"))
    report = await run_claude(request, recorder, spares=spares)

    assert report.status is RunStatus.SUCCEEDED
    spawned = recorder.of(Spawned)[0]
    assert spawned.live.supervisor_pid == spare_pid
    # claude got the run's environment and directory from the spare's orders.
    rec = record(tmp_path)
    assert rec["env"][MARKER_ENV] == run_id
    assert rec["env"]["FAKE_CLAUDE_RECORD"] == str(tmp_path / "record.json")
    assert Path(rec["cwd"]) == tmp_path
    assert_nothing_left(run_id, tmp_path)
    assert spares._ready is None  # taken; the next one comes a little later
    await spares.close()


async def test_without_a_ready_spare_the_run_starts_its_own_supervisor(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    spares = Spares()
    spares.refill()
    dead = spares._ready
    assert dead is not None
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait()

    report = await run_claude(
        make_request(run_id, tmp_path, env=fake_env(tmp_path)), recorder, spares=spares
    )

    assert report.status is RunStatus.SUCCEEDED
    assert recorder.of(Spawned)[0].live.supervisor_pid != dead.proc.pid
    assert_nothing_left(run_id, tmp_path)
    await spares.close()


async def test_a_spare_let_go_exits_on_its_own_and_none_is_started_after() -> None:
    spares = Spares()
    spares.refill()
    spare = spares._ready
    assert spare is not None

    await spares.close()

    assert spare.proc.returncode == 0  # it read the end of its pipe: not killed
    spares.refill()
    spares.refill_soon()
    assert spares._ready is None
    assert spares._soon is None


async def test_a_spare_exits_when_its_bridge_dies_before_giving_orders() -> None:
    spare = start_spare()
    # The bridge's death closes its ends: the pipe and the connection.
    os.close(spare.orders)
    spare.conn.close()

    assert await exited(spare) == 0


@pytest.mark.parametrize(
    "orders",
    [
        {"args": ["--run-id=x"], "env": {"A": 1}},
        {"args": "--run-id=x", "env": {}},
        {"env": {}},
        ["--run-id=x"],
    ],
)
async def test_a_spare_refuses_bad_orders(orders: object) -> None:
    spare = start_spare()
    os.write(spare.orders, json.dumps(orders).encode())
    os.close(spare.orders)

    assert await exited(spare) == 2  # EXIT_USAGE
    spare.conn.close()


async def test_refill_soon_starts_one_spare_later(tmp_path: Path) -> None:
    spares = Spares()
    spares.refill_soon()
    spares.refill_soon()  # one on its way already
    soon = spares._soon
    assert soon is not None
    assert spares._ready is None
    soon._run()  # the timer, without waiting for it
    assert spares._ready is not None
    spares.refill()  # one is ready: no second
    await spares.close()


async def test_recovery_finds_and_stops_a_supervisor_that_was_a_spare(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    spares = Spares()
    spares.refill()
    spare = spares._ready
    assert spare is not None
    request = make_request(run_id, tmp_path, env=fake_env(tmp_path, sleep="60"))
    task = asyncio.create_task(run_claude(request, recorder, spares=spares))
    await recorder.wait_for(Spawned)

    # Neither its command line nor its environment name the run: its directory does.
    assert [pid for pid, _ in _supervisor_candidates(run_id)] == [spare.proc.pid]
    await recover_run(run_id, "")

    report = await task
    assert report.status is not RunStatus.SUCCEEDED
    assert not is_alive(spare.proc.pid)
    assert_nothing_left(run_id)
    await spares.close()

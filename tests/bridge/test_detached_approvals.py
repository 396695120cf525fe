"""Tool requests across a restart of the bridge (the real ``chatbridge`` process, runs left
to their supervisors): a waiting request is answered after the restart, under the same
number and not asked twice; a decision recorded but never delivered is sent after it; a
request that ran out of time while the bridge was down is denied."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from tests.bridge.bridge_process import Bridge, wait_rows
from tests.bridge.detached_runs import wait_for_offset, waiting
from tests.bridge.harness import rows, write_config
from tests.config_files import Table
from tests.fakes.fake_claude import tool_log

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftovers")]

WAIT_S = 60.0


async def asked_then_left(tmp_path: Path, how: signal.Signals, config: Table | None = None) -> Path:
    """A bridge whose run waits on request #1 (and then on ``go``), ended by ``how``."""
    env = {**waiting(tmp_path), "FAKE_CLAUDE_TOOL_LOG": str(tmp_path / "tools.jsonl")}
    table: Table = {"defaults": {"approve_tools": True, **(config or {})}}
    path = write_config(tmp_path, table, env=env)
    bridge = Bridge(path)
    await bridge.start()
    bridge.send("long job")
    await bridge.wait_for("(request `#1`")
    run_id = str(rows(tmp_path, "select id from runs")[0][0])
    await wait_for_offset(tmp_path, run_id)
    await wait_rows(tmp_path, "select message_id is not null from approvals", [(1,)])
    bridge.signal(how)
    await bridge.exit_code()
    return path


async def finish(again: Bridge, tmp_path: Path) -> None:
    (tmp_path / "go").touch()
    await again.wait_for("\nlong job\n")
    assert await again.end_input() == 0


async def test_a_request_waiting_at_a_restart_is_answered_after_it(tmp_path: Path) -> None:
    async with asyncio.timeout(WAIT_S):
        config = await asked_then_left(tmp_path, signal.SIGTERM)
        again = Bridge(config)
        await again.start()
        again.send("!approve #1")
        await again.wait_for("Request `#1` (`Bash`): allowed by")
        await finish(again, tmp_path)
    assert "Claude asks to use" not in again.out  # not asked twice
    assert "had already ended" not in again.out  # (answered before the run was reattached)
    assert rows(tmp_path, "select number, state from approvals") == [(1, "allowed")]
    assert [t["command"] for t in tool_log(tmp_path)] == ["echo hello"]


async def test_a_decision_recorded_but_not_delivered_is_sent_after_the_restart(
    tmp_path: Path,
) -> None:
    async with asyncio.timeout(WAIT_S):
        config = await asked_then_left(tmp_path, signal.SIGKILL)
        # As if the bridge died between recording the answer and writing it to claude.
        with sqlite3.connect(tmp_path / "bridge.db") as db:
            db.execute(
                "update approvals set state = 'allowed', decided_by = 'local', decided_at = ?",
                (time.time(),),
            )
        again = Bridge(config)
        await again.start()
        while not tool_log(tmp_path):
            await asyncio.sleep(0.05)
        # The request message is shown decided (its buttons go), not left open.
        await again.wait_for("· Request `#1` (`Bash`): allowed by `local`")
        await finish(again, tmp_path)
    assert "Claude asks to use" not in again.out


async def test_a_request_that_ran_out_of_time_while_the_bridge_was_down_is_denied(
    tmp_path: Path,
) -> None:
    async with asyncio.timeout(WAIT_S):
        config = await asked_then_left(tmp_path, signal.SIGTERM, {"approval_timeout_s": 2})
        await asyncio.sleep(2)
        again = Bridge(config)
        await again.start()
        await again.wait_for("Request `#1` (`Bash`): denied: nobody answered in time")
        await finish(again, tmp_path)
    assert rows(tmp_path, "select state from approvals") == [("expired",)]
    assert tool_log(tmp_path) == []


async def test_the_requests_of_a_run_interrupted_at_the_restart_are_cancelled(
    tmp_path: Path,
) -> None:
    async with asyncio.timeout(WAIT_S):
        config = await asked_then_left(tmp_path, signal.SIGKILL)
        # Not to be followed after the restart (here: its journal is gone): the run is
        # reported interrupted, so nothing can answer its request any more.
        [journal] = (tmp_path / "state").rglob("journal")
        journal.unlink()
        again = Bridge(config)
        await again.start()
        await again.wait_for("did not finish before chatbridge restarted")
        await again.wait_for("· Request `#1` (`Bash`): cancelled: the run ended (interrupted)")
        again.send("!status")
        await again.wait_for("Session:")
        again.send("!approve")
        await again.wait_for("No tool request is waiting.")
        assert await again.end_input() == 0
    assert "Tool requests waiting" not in again.out
    assert rows(tmp_path, "select state from approvals") == [("cancelled",)]
    assert tool_log(tmp_path) == []

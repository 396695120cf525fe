"""A run's cost reaches the ledger however the run ends (docs/budgets.md): the console
room, the fake claude, SQLite."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.core.model import RoomId, RoomKey, SessionId, TransportName
from tests.bridge.harness import rows
from tests.bridge.live_runs import WAIT_S, gated, session, until_tool_runs
from tests.config_files import Table

COSTLY: Table = {"defaults": {"daily_budget_usd": 0.5}}
CONSOLE = RoomKey(TransportName("console"), RoomId("console"))


async def test_a_stopped_runs_cost_reaches_the_ledger_and_the_budget_binds(tmp_path: Path) -> None:
    # claude's interrupted turn prints a result with the turn's cost: the run spent it.
    env = {**gated(tmp_path), "FAKE_CLAUDE_COST": "1.0"}
    async with asyncio.timeout(WAIT_S), session(tmp_path, COSTLY, **env) as bridge:
        assert bridge.service is not None
        bridge.send("a long job")
        await until_tool_runs(bridge, tmp_path)
        bridge.send("!stop")
        await bridge.wait_for("Stopping the run")
        await bridge.service.parts.dispatcher.wait_idle()
        bridge.send("!status")
        await bridge.wait_for("Spent today (UTC): $1.00 in this room of $0.50")
        bridge.send("another job")
        await bridge.wait_for("this room's daily budget is spent")
        metrics = bridge.service.parts.metrics.exposition().decode()
    assert rows(tmp_path, "select status, cost_usd from runs order by seq") == [
        ("stopped", 1.0),
        ("failed", None),  # refused: claude never ran, so nothing is known of a cost
    ]
    assert rows(tmp_path, "select cost_usd from spend") == [(1.0,)]
    assert "chatbridge_claude_cost_usd_total 1.0" in metrics


@pytest.mark.parametrize("limit", ["run_timeout_s", "idle_timeout_s"])
async def test_a_run_cut_by_a_time_limit_reports_what_claude_spent(
    tmp_path: Path, limit: str
) -> None:
    # At the limit the supervisor interrupts claude (SIGINT) before it stops the run:
    # claude's interrupted turn prints its result, with the cost.
    config: Table = {"defaults": {"daily_budget_usd": 0.5, limit: 1}}
    env = {**gated(tmp_path), "FAKE_CLAUDE_COST": "1.0"}
    async with asyncio.timeout(WAIT_S), session(tmp_path, config, **env) as bridge:
        assert bridge.service is not None
        bridge.send("a long job")
        await bridge.wait_for("`!retry run-")
        await bridge.service.parts.dispatcher.wait_idle()
        bridge.send("another job")
        await bridge.wait_for("this room's daily budget is spent")
    status = "timed_out" if limit == "run_timeout_s" else "stalled"
    assert rows(tmp_path, "select status, cost_usd from runs order by seq") == [
        (status, 1.0),
        ("failed", None),
    ]
    assert rows(tmp_path, "select cost_usd from spend") == [(1.0,)]


async def test_a_retry_in_a_new_session_does_not_take_the_lost_sessions_cost(
    tmp_path: Path,
) -> None:
    """Found in the review of issue 25's run endings."""
    # The first try finds the session gone (claude prints a zeroed result); the second,
    # in a new session, dies before any result: what it cost is unknown, not $0.
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    env = {"FAKE_CLAUDE_SESSIONS_DIR": str(sessions), "FAKE_CLAUDE_EXIT": "1"}
    async with asyncio.timeout(WAIT_S), session(tmp_path, {}, **env) as bridge:
        assert bridge.service is not None
        await bridge.service.store.set_session(CONSOLE, SessionId("a-lost-session"))
        bridge.send("a job")
        await bridge.wait_for("continuing in a new session")
        await bridge.wait_for("`!retry run-")
        await bridge.service.parts.dispatcher.wait_idle()
    assert rows(tmp_path, "select status, cost_usd from runs") == [("failed", None)]
    assert rows(tmp_path, "select cost_usd from spend") in ([], [(None,)])

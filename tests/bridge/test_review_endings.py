"""Review of issue 25's endings in the bridge: what a run's end records of its cost
(docs/budgets.md). The console room, the fake claude, SQLite."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bridge.core.model import RoomId, RoomKey, SessionId, TransportName
from tests.bridge.test_live_runs import WAIT_S, rows, session

CONSOLE = RoomKey(TransportName("console"), RoomId("console"))


async def test_a_retry_in_a_new_session_does_not_take_the_lost_sessions_cost(
    tmp_path: Path,
) -> None:
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
        await bridge.service.dispatcher.wait_idle()
    assert rows(tmp_path, "select status, cost_usd from runs") == [("failed", None)]
    assert rows(tmp_path, "select cost_usd from spend") in ([], [(None,)])

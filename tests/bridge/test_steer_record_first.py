"""A message steered into a running run is recorded as the run's before it is written
into claude (docs/live-runs.md): a crash at any await between the two leaves it unsent,
so it never runs twice. The crash points are injected into the store (the console room,
the fake claude, SQLite)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.config import load_settings
from bridge.core.model import Batch, RoomId, RoomKey, RunId, TransportName
from bridge.store.base import Store, StoreError
from tests.bridge.harness import ConsoleSession, write_config
from tests.bridge.live_runs import WAIT_S, during_run, rows, until_tool_runs
from tests.fakes.flaky_store import StoreWrapper

CONSOLE = RoomKey(TransportName("console"), RoomId("console"))


class CrashPoint(StoreWrapper):
    """Wraps the store: ``steer_into_run`` stops at ``where`` until released (a crash
    there: nothing after it happens), its other calls go through."""

    def __init__(self, inner: Store, where: str) -> None:
        super().__init__(inner)
        self.where = where
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.tries = 0

    async def steer_into_run(self, run_id: RunId, batch: Batch, at: float) -> None:
        self.tries += 1
        if self.where == "before the record":
            await self._stop_here()
        elif self.where == "between tries" and self.tries == 1:
            # The first try fails: the executor sleeps, then tries again; the second
            # try stops before it writes (the sleep between is the await covered).
            raise StoreError("injected failure of steer_into_run")
        elif self.where == "between tries":
            await self._stop_here()
        await self.inner.steer_into_run(run_id, batch, at)
        if self.where == "after the commit":
            await self._stop_here()

    async def _stop_here(self) -> None:
        self.reached.set()
        await self.release.wait()


@pytest.mark.parametrize("mode", ["steer", "interrupt"])
@pytest.mark.parametrize("where", ["before the record", "between tries", "after the commit"])
async def test_a_steered_message_is_written_into_claude_only_after_it_is_recorded(
    tmp_path: Path, mode: str, where: str
) -> None:
    env = {
        "FAKE_CLAUDE_ECHO": "1",
        "FAKE_CLAUDE_TOOL_LOG": str(tmp_path / "tools.jsonl"),
        "FAKE_CLAUDE_TOOL_UNTIL_MESSAGE": "1",
        "FAKE_CLAUDE_TOOL_TURNS": "1",  # an interrupted turn's successor answers in text
    }
    settings = load_settings(write_config(tmp_path, during_run(mode), env=env))
    crash: list[CrashPoint] = []

    def wrap(store: Store) -> Store:
        crash.append(CrashPoint(store, where))
        return crash[0].store

    async with asyncio.timeout(WAIT_S), ConsoleSession(settings, wrap_store=wrap) as bridge:
        assert bridge.service is not None
        bridge.send("first tok-A")
        await until_tool_runs(bridge, tmp_path)
        bridge.send("second tok-B")
        await crash[0].reached.wait()
        try:
            # The crash point: whatever was recorded, nothing of tok-B went into claude.
            control = bridge.service.executor.live_runs.control(CONSOLE)
            assert control is not None
            assert control.messages_sent == 1  # the run's prompt alone
            recorded = rows(tmp_path, "select state from messages where text like '%tok-B%'")
            committed = where == "after the commit"
            assert recorded == ([("dispatched",)] if committed else [("pending",)])
        finally:
            crash[0].release.set()  # (also after a failure: the run can end)
        out = await bridge.wait_for("tok-B")
        await bridge.service.dispatcher.wait_idle()
    assert out.count("tok-B") == 1  # answered once
    [(run_id,)] = rows(tmp_path, "select id from runs")
    assert rows(tmp_path, "select state, run_id from messages order by id") == [
        ("done", run_id),
        ("done", run_id),
    ]

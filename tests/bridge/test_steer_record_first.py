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
from runner import run as runner_run
from runner.control import RunControl
from tests.bridge.harness import ECHO, ConsoleSession, rows, write_config
from tests.bridge.live_runs import WAIT_S, during_run, gated, until_output_and, until_tool_runs
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
            control = bridge.service.parts.executor.live_runs.control(CONSOLE)
            assert control is not None
            assert control.messages_sent == 1  # the run's prompt alone
            recorded = rows(tmp_path, "select state from messages where text like '%tok-B%'")
            committed = where == "after the commit"
            assert recorded == ([("dispatched",)] if committed else [("pending",)])
        finally:
            crash[0].release.set()  # (also after a failure: the run can end)
        out = await bridge.wait_for("tok-B")
        await bridge.service.parts.dispatcher.wait_idle()
    assert out.count("tok-B") == 1  # answered once
    [(run_id,)] = rows(tmp_path, "select id from runs")
    assert rows(tmp_path, "select state, run_id from messages order by id") == [
        ("done", run_id),
        ("done", run_id),
    ]


class SteerNeverRecorded(StoreWrapper):
    """Wraps the store: recording a message steered into a run keeps failing (each try
    once ``release`` is set)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def steer_into_run(self, run_id: RunId, batch: Batch, at: float) -> None:
        self.reached.set()
        await self.release.wait()
        raise StoreError("injected: the database keeps failing")


@pytest.mark.parametrize("answered_meanwhile", [False, True])
@pytest.mark.parametrize("mode", ["steer", "interrupt"])
async def test_a_steered_message_that_cannot_be_recorded_is_not_sent(
    tmp_path: Path, mode: str, answered_meanwhile: bool
) -> None:
    """Found in the review of issue 25's run endings."""
    # Record, then send: sent unrecorded, claude answers it and it stays pending, so
    # the next start runs it a second time. ``answered_meanwhile``: claude answers the
    # run's prompt while the record is tried: the run ends on that answer, given once.
    env = {**ECHO, **gated(tmp_path), "FAKE_CLAUDE_TOOL_LOG": str(tmp_path / "tools.jsonl")}
    settings = load_settings(write_config(tmp_path, during_run(mode), env=env))
    failing: list[SteerNeverRecorded] = []

    def wrap(store: Store) -> Store:
        failing.append(SteerNeverRecorded(store))
        return failing[0].store

    async with asyncio.timeout(WAIT_S), ConsoleSession(settings, wrap_store=wrap) as bridge:
        assert bridge.service is not None
        bridge.service.parts.executor.store_retry_delays_s = (0.01,)
        if answered_meanwhile:
            failing[0].release.clear()
        bridge.send("first tok-A")
        await until_tool_runs(bridge, tmp_path)
        bridge.send("second tok-B")
        await failing[0].reached.wait()
        if answered_meanwhile:
            (tmp_path / "gate").touch()
            # The answer is held while the message is promised: not shown yet.
            await until_result_read(bridge)
            failing[0].release.set()
        await bridge.wait_for("could not be added to the run")
        (tmp_path / "gate").touch()
        out = await bridge.wait_for("first tok-A\n")
        await bridge.service.parts.dispatcher.wait_idle()
        out = await bridge.finish()
    [(state,)] = rows(tmp_path, "select state from messages where text like '%tok-B%'")
    assert state == "pending"  # kept for the next start, which runs it once
    assert "second tok-B\n" not in out  # so claude never had it
    assert out.count("first tok-A\n") == 1
    assert rows(tmp_path, "select status from runs") == [("succeeded",)]


async def until_result_read(bridge: ConsoleSession) -> None:
    """The run's control saw claude's result (the run's prompt answered)."""
    service = bridge.service
    assert service is not None

    def read() -> bool:
        control = service.parts.executor.live_runs.control(CONSOLE)
        return control is not None and bool(control._results)

    await until_output_and(bridge, read)


class SlowSteer(StoreWrapper):
    """Wraps the store: recording a steered message waits for ``release`` (a database
    slower than a detaching shutdown waits for it)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def steer_into_run(self, run_id: RunId, batch: Batch, at: float) -> None:
        self.reached.set()
        await self.release.wait()
        await self.inner.steer_into_run(run_id, batch, at)


async def until_sent(bridge: ConsoleSession, count: int) -> None:
    """The reattached run was written ``count`` user messages (or takes no more)."""
    assert bridge.service is not None
    while True:
        control = bridge.service.parts.executor.live_runs.control(CONSOLE)
        if control is not None and (control.messages_sent >= count or control.closed):
            return
        await asyncio.sleep(0.01)


async def until_closed(control: RunControl) -> None:
    while not control.closed:
        await asyncio.sleep(0.01)


async def test_a_message_recorded_into_a_run_but_not_sent_reaches_it_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in the review of issue 25's run endings."""
    # The state a kill -9 between a steered message's record and its send leaves (here:
    # the record lands after a detaching shutdown gave up waiting for it): the message
    # is the run's, and claude never had it. The reattached run gets it (the journal
    # tells it was never written), rather than ending without it, the room untold.
    monkeypatch.setattr(runner_run, "PROMISE_WAIT_S", 0.2)
    env = {**ECHO, **gated(tmp_path), "FAKE_CLAUDE_TOOL_LOG": str(tmp_path / "tools.jsonl")}
    settings = load_settings(write_config(tmp_path, during_run("steer"), env=env))
    slow: list[SlowSteer] = []

    def wrap(store: Store) -> Store:
        slow.append(SlowSteer(store))
        return slow[0].store

    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, wrap_store=wrap) as bridge:
            assert bridge.service is not None
            bridge.send("first tok-A")
            await until_tool_runs(bridge, tmp_path)
            control = bridge.service.parts.executor.live_runs.control(CONSOLE)
            assert control is not None
            bridge.send("second tok-B")
            await slow[0].reached.wait()
            bridge.service.request_stop()  # a shutdown: the run is left running
            finishing = asyncio.create_task(bridge.finish())
            await until_closed(control)  # left to its supervisor, tok-B unsent
            slow[0].release.set()
            await finishing
        assert rows(tmp_path, "select state from messages where text like '%tok-B%'") == [
            ("dispatched",)
        ]
        async with ConsoleSession(settings) as bridge:
            assert bridge.service is not None
            await until_sent(bridge, 2)  # the prompt (replayed), then tok-B
            (tmp_path / "gate").touch()
            out = await bridge.wait_for("tok-B")
            await bridge.service.parts.dispatcher.wait_idle()
            out = await bridge.finish()
    assert "second tok-B" in out
    assert rows(tmp_path, "select state from messages order by id") == [("done",), ("done",)]

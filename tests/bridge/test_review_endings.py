"""Review of issue 25's endings in the bridge: what a run's end records of its cost, and
the retry after a usage limit as an offer a ``!stop`` calls off (docs/budgets.md). The
console room, the fake claude, SQLite."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from bridge.config import load_settings
from bridge.core.model import (
    Batch,
    Message,
    RoomId,
    RoomKey,
    RunId,
    SessionId,
    TransportName,
)
from bridge.store.base import Store, StoreError
from runner import run as runner_run
from runner.control import RunControl
from tests.bridge.harness import ECHO, ConsoleSession, write_config
from tests.bridge.live_runs import (
    WAIT_S,
    during_run,
    gated,
    rows,
    session,
    until_output_and,
    until_tool_runs,
)
from tests.config_files import Table
from tests.fakes.flaky_store import StoreWrapper

T = TypeVar("T")

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


class RetryAtStop(StoreWrapper):
    """Wraps the store: the retry after a usage limit, fired at the reset, stops at its
    re-queue until ``!stop`` calls the retry off (``drop_limit_resume``): the two race."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.reached = asyncio.Event()
        self.called_off = asyncio.Event()
        self.done = asyncio.Event()

    async def drop_limit_resume(self, run_id: RunId) -> bool:
        dropped = await self.inner.drop_limit_resume(run_id)
        self.called_off.set()
        return dropped

    async def requeue_run(self, run_id: RunId) -> list[Message]:
        return await self._raced(self.inner.requeue_run(run_id))

    async def requeue_limit_resume(self, run_id: RunId) -> list[Message] | None:
        return await self._raced(self.inner.requeue_limit_resume(run_id))

    async def _raced(self, requeue: Awaitable[T]) -> T:
        self.reached.set()
        await self.called_off.wait()
        try:
            return await requeue
        finally:
            self.done.set()


async def test_a_limit_retry_firing_at_a_stop_is_either_called_off_or_stopped(
    tmp_path: Path,
) -> None:
    once = tmp_path / "limited-once"
    env = {"FAKE_CLAUDE_USAGE_LIMIT": "1", "FAKE_CLAUDE_USAGE_LIMIT_ONCE": str(once)}
    config: Table = {"runner": {"resume_after_limit": True}}
    raced: list[RetryAtStop] = []

    def wrap(store: Store) -> Store:
        raced.append(RetryAtStop(store))
        return raced[0].store

    settings = load_settings(write_config(tmp_path, config, env={**ECHO, **env}))
    async with asyncio.timeout(WAIT_S), ConsoleSession(settings, wrap_store=wrap) as bridge:
        assert bridge.service is not None
        bridge.send("the job tok-L")
        await bridge.wait_for("chatbridge retries this run then (once)")
        await raced[0].reached.wait()  # the reset came: the retry is being made
        bridge.send("!stop")
        out = await bridge.wait_for("Called off the retry after the usage limit")
        await raced[0].done.wait()
        await bridge.service.dispatcher.wait_idle()
        out = await bridge.finish()
    # Told it was called off, the room must not see it run (nor its answer).
    assert out.count("the job tok-L\n") == 0
    assert rows(tmp_path, "select status from runs order by seq") == [("failed",)]


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
        bridge.service.executor.store_retry_delays_s = (0.01,)
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
        await bridge.service.dispatcher.wait_idle()
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
        control = service.executor.live_runs.control(CONSOLE)
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
        control = bridge.service.executor.live_runs.control(CONSOLE)
        if control is not None and (control.messages_sent >= count or control.closed):
            return
        await asyncio.sleep(0.01)


async def until_closed(control: RunControl) -> None:
    while not control.closed:
        await asyncio.sleep(0.01)


async def test_a_message_recorded_into_a_run_but_not_sent_reaches_it_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
            control = bridge.service.executor.live_runs.control(CONSOLE)
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
            await bridge.service.dispatcher.wait_idle()
            out = await bridge.finish()
    assert "second tok-B" in out
    assert rows(tmp_path, "select state from messages order by id") == [("done",), ("done",)]

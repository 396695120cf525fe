"""The driver's steer hook and prestarter calls, with a manual clock."""

from __future__ import annotations

import logging

import pytest

from bridge.core.model import Batch, RoomKey
from dispatcher import (
    DispatchedRun,
    Dispatcher,
    DispatchLimits,
    DuringRun,
    ManualClock,
    PrestartCancel,
    StopResult,
)
from tests.dispatcher.fakes import FakeExecute, Messages, room, serving

A, B = room("a"), room("b")
LIMITS = DispatchLimits(coalesce_s=1.0, max_wait_s=5.0, max_batch=3, max_concurrent_runs=2)


class Steering:
    """A steer hook that answers as told and records what it was offered."""

    def __init__(self, answer: bool = True) -> None:
        self.answer = answer
        self.error: Exception | None = None
        self.offers: list[tuple[Batch, bool]] = []

    def __call__(self, batch: Batch, interrupt: bool) -> bool:
        self.offers.append((batch, interrupt))
        if self.error is not None:
            raise self.error
        return self.answer


class RecordingPrestarter:
    def __init__(self) -> None:
        self.calls: list[tuple[str, RoomKey, str]] = []
        self.error: Exception | None = None

    def begin(self, room: RoomKey) -> None:
        self.calls.append(("begin", room, ""))
        if self.error is not None:
            raise self.error

    def cancel(self, room: RoomKey, why: str) -> None:
        self.calls.append(("cancel", room, why))
        if self.error is not None:
            raise self.error


class Env:
    def __init__(
        self, modes: dict[RoomKey, DuringRun] | None = None, max_prestarts: int = 0
    ) -> None:
        self.clock = ManualClock()
        self.execute = FakeExecute(cap=LIMITS.max_concurrent_runs)
        self.prestarter = RecordingPrestarter()
        known = modes or {}
        self.dispatcher = Dispatcher(
            LIMITS,
            self.execute,
            self.clock,
            mode_of=lambda key: known.get(key, DuringRun.QUEUE),
            prestarter=self.prestarter,
            max_prestarts=max_prestarts,
        )
        self.make = Messages()


async def begun_run(env: Env, steer: Steering | None) -> DispatchedRun:
    env.dispatcher.submit(env.make(A))
    env.clock.advance(1.0)
    call = await env.execute.started(A)
    call.run.steer = steer
    return call.run


async def test_a_steer_batch_goes_to_the_runs_hook_and_is_the_runs_when_taken() -> None:
    env = Env({A: DuringRun.INTERRUPT})
    d, clock = env.dispatcher, env.clock
    steering = Steering()
    async with serving(d):
        await begun_run(env, steering)
        msgs = [env.make(A), env.make(A)]
        for m in msgs:
            d.submit(m)
        assert d.status(A).steering == 2
        assert d.queued == 2
        clock.advance(1.0)
        assert steering.offers == [(Batch(A, tuple(msgs)), True)]
        status = d.status(A)
        assert (status.waiting, status.steering, status.steered) == (0, 0, 2)
        assert d.queued == 0
        await env.execute.finish(A)
        assert d.tracked_rooms == 0
    assert len(env.execute.calls) == 1  # no follow-up: the run took them


@pytest.mark.parametrize("hook", ["refuses", "none", "raises"])
async def test_a_steer_batch_not_taken_is_the_follow_up_run(
    hook: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = Env({A: DuringRun.STEER})
    d, clock = env.dispatcher, env.clock
    steering = Steering(answer=False)
    if hook == "raises":
        steering.error = RuntimeError("boom")
    async with serving(d):
        await begun_run(env, None if hook == "none" else steering)
        msgs = [env.make(A), env.make(A)]
        d.submit(msgs[0])
        clock.advance(1.0)  # offered, not taken
        d.submit(msgs[1])  # queues behind it
        assert d.status(A).waiting == 2
        assert d.status(A).steering == 0
        await env.execute.finish(A)
        assert (await env.execute.started(A)).batch.messages == tuple(msgs)
    if hook == "raises":
        assert "steering the run in room" in caplog.text
    assert env.execute.violations == []


async def test_queue_mode_by_default() -> None:
    clock = ManualClock()
    execute = FakeExecute()
    d = Dispatcher(LIMITS, execute, clock)
    make = Messages()
    async with serving(d):
        d.submit(make(A))
        clock.advance(1.0)
        call = await execute.started(A)
        steering = Steering()
        call.run.steer = steering
        d.submit(make(A))
        clock.advance(5.0)
        assert steering.offers == []
        assert d.status(A).steering == 0
        assert not call.run.prestarted


async def test_a_stop_drops_steer_messages_not_the_ones_taken() -> None:
    env = Env({A: DuringRun.STEER})
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        run = await begun_run(env, Steering())
        d.submit(env.make(A))
        clock.advance(1.0)  # taken
        pending = env.make(A)
        d.submit(pending)
        assert d.stop(A) == StopResult(stopped=run.batch, dropped=(pending,))


async def test_the_prestarter_is_told_to_begin_and_the_run_takes_it() -> None:
    env = Env(max_prestarts=1)
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        d.submit(env.make(A))
        assert env.prestarter.calls == [("begin", A, "")]
        assert d.prestarts == 1
        clock.advance(1.0)
        call = await env.execute.started(A)
        assert call.run.prestarted
        assert d.prestarts == 0
        d.submit(env.make(B))  # 1 run + 0 prestarts < 2
        d.stop(B)
        assert env.prestarter.calls[1:] == [
            ("begin", B, ""),
            ("cancel", B, PrestartCancel.DROPPED),
        ]
        d.submit(env.make(B))
        env.prestarter.calls.clear()
    # Serving ends: a drain, which cancels the prestart still held.
    assert env.prestarter.calls == [("cancel", B, "shutdown")]


async def test_a_failing_prestarter_is_logged_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = Env(max_prestarts=1)
    env.prestarter.error = RuntimeError("no process")
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        with caplog.at_level(logging.ERROR):
            d.submit(env.make(A))
        assert "prestarter begin failed" in caplog.text
        clock.advance(1.0)
        call = await env.execute.started(A)
        assert call.run.prestarted  # execute finds none, and starts cold
        await env.execute.finish(A)


async def test_without_a_prestarter_nothing_is_prestarted() -> None:
    clock = ManualClock()
    execute = FakeExecute()
    d = Dispatcher(LIMITS, execute, clock, max_prestarts=2)
    make = Messages()
    async with serving(d):
        d.submit(make(A))
        assert d.prestarts == 0
        clock.advance(1.0)
        assert not (await execute.started(A)).run.prestarted

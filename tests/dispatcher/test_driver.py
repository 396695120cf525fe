"""The asyncio driver, rule by rule, with a manual clock and a controllable execute."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bridge.core.model import Batch, RoomKey
from dispatcher import (
    Dispatcher,
    DispatchLimits,
    EndReason,
    ManualClock,
    MonotonicClock,
    StopResult,
)
from tests.dispatcher.fakes import GUARD_S, Call, FakeExecute, Messages, room, serving

A, B, C = room("a"), room("b"), room("c")


def limits(
    coalesce: float = 1.0, max_wait: float = 5.0, max_batch: int = 3, cap: int = 2
) -> DispatchLimits:
    return DispatchLimits(coalesce, max_wait, max_batch, cap)


class Env:
    def __init__(self, lim: DispatchLimits) -> None:
        self.clock = ManualClock()
        self.execute = FakeExecute(cap=lim.max_concurrent_runs)
        self.dispatcher = Dispatcher(lim, self.execute, self.clock)
        self.make = Messages()


@pytest.fixture
def env() -> Env:
    return Env(limits())


async def test_debounce_flushes_when_the_window_closes(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        first = env.make(A)
        d.submit(first)
        clock.advance(0.6)
        second = env.make(A)
        d.submit(second)  # restarts the window: now closes at 1.6
        clock.advance(0.9)
        assert d.status(A).running is None
        assert d.status(A).waiting == 2
        clock.advance(0.1)
        assert d.status(A).running is not None
        assert d.status(A).running_since == 1.6
        call = await env.execute.started(A)
        assert call.batch.messages == (first, second)
        await env.execute.finish(A)
        assert d.tracked_rooms == 0
    assert env.execute.violations == []


async def test_max_wait_flushes_a_busy_window() -> None:
    env = Env(limits(coalesce=1.0, max_wait=2.0, max_batch=99))
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        for _ in range(4):
            d.submit(env.make(A))
            clock.advance(0.5)
        assert clock.now() == 2.0
        status = d.status(A)
        assert status.running is not None
        assert len(status.running.messages) == 4
        assert status.running_since == 2.0


async def test_max_batch_flushes_at_once(env: Env) -> None:
    d = env.dispatcher
    async with serving(d):
        msgs = [env.make(A) for _ in range(4)]
        for m in msgs:
            d.submit(m)
        call = await env.execute.started(A)
        assert call.batch.messages == tuple(msgs[:3])
        assert d.status(A).waiting == 1  # the fourth waits for the next run
        assert env.clock.now() == 0.0


async def test_queue_during_a_run_goes_at_once_in_batches_of_max_batch(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        d.submit(env.make(A))
        clock.advance(1.0)
        await env.execute.started(A)
        queued = [env.make(A) for _ in range(5)]
        for m in queued:
            d.submit(m)
        clock.advance(10.0)  # no debounce window while running
        assert d.status(A).waiting == 5
        await env.execute.finish(A)
        assert (await env.execute.started(A)).batch.messages == tuple(queued[:3])
        assert d.status(A).waiting == 2
        await env.execute.finish(A)
        assert (await env.execute.started(A)).batch.messages == tuple(queued[3:])
        await env.execute.finish(A)
        assert d.tracked_rooms == 0
        assert clock.now() == 11.0  # all of it without time passing


async def test_global_cap_grants_slots_in_arrival_order() -> None:
    env = Env(limits(max_batch=2, cap=1))
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        d.submit(env.make(A))
        clock.advance(1.0)  # A runs
        b1, b2, b3 = env.make(B), env.make(B), env.make(B)
        d.submit(b1)
        clock.advance(1.0)  # B is ready first...
        d.submit(env.make(C))
        clock.advance(1.0)  # ...then C
        d.submit(b2)
        d.submit(b3)  # B keeps gathering while it waits
        assert d.status(B).waiting_for_slot
        assert d.status(C).waiting_for_slot
        assert d.status(B).waiting == 3
        await env.execute.finish(A)
        assert (await env.execute.started(B)).batch.messages == (b1, b2)
        assert d.status(B).waiting == 1
        assert d.status(C).waiting_for_slot
        await env.execute.finish(B)
        await env.execute.started(C)  # C waited longer than B's rest
        assert d.status(B).waiting_for_slot
        await env.execute.finish(C)
        assert (await env.execute.started(B)).batch.messages == (b3,)
    assert env.execute.violations == []


async def test_stop_cancels_the_run_and_drops_waiting_messages(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    env.execute.slow_cleanup = True
    async with serving(d):
        d.submit(env.make(A))
        clock.advance(1.0)
        call = await env.execute.started(A)
        dropped = [env.make(A), env.make(A)]
        for m in dropped:
            d.submit(m)
        result = d.stop(A)
        assert result == StopResult(stopped=call.batch, dropped=tuple(dropped))
        assert d.stop(A) == StopResult(stopped=None, dropped=())  # already stopping
        await env.execute.cancelled(call)
        # The run winds down slowly; what arrives meanwhile waits for it.
        late = env.make(A)
        d.submit(late)
        status = d.status(A)
        assert status.stopping
        assert status.running == call.batch
        assert status.waiting == 1
        assert call.cleanup_gate is not None
        call.cleanup_gate.set()
        await env.execute.ended(call)
        next_call = await env.execute.started(A)
        assert next_call.batch.messages == (late,)
        assert not d.status(A).stopping
        await env.execute.finish(A)
    assert env.execute.violations == []


async def test_stop_while_waiting_for_a_slot_gives_the_place_up() -> None:
    env = Env(limits(cap=1))
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        d.submit(env.make(A))
        clock.advance(1.0)
        b = env.make(B)
        d.submit(b)
        d.submit(env.make(C))
        clock.advance(1.0)
        assert d.status(B).waiting_for_slot
        assert d.stop(B) == StopResult(stopped=None, dropped=(b,))
        assert d.status(B).waiting == 0
        await env.execute.finish(A)
        await env.execute.started(C)
        assert [call.batch.room for call in env.execute.calls] == [A, C]


async def test_stop_while_gathering_drops_the_open_batch(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        m = env.make(A)
        d.submit(m)
        assert d.stop(A) == StopResult(stopped=None, dropped=(m,))
        assert d.tracked_rooms == 0
        clock.advance(10.0)
        assert d.active_runs == 0
        assert env.execute.calls == []
        await d.wait_idle()


async def test_stop_before_execute_was_called_reports_the_batch_dropped(env: Env) -> None:
    d = env.dispatcher
    async with serving(d):
        msgs = [env.make(A) for _ in range(3)]  # max_batch: the run starts now
        for m in msgs:
            d.submit(m)
        assert d.status(A).running is not None
        # execute has not been called yet: it never will be.
        assert d.stop(A) == StopResult(stopped=None, dropped=tuple(msgs))
        async with asyncio.timeout(GUARD_S):
            await d.wait_idle()
        assert env.execute.calls == []


async def test_a_failing_run_is_logged_and_frees_its_slot(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        d.submit(env.make(A))
        clock.advance(1.0)
        await env.execute.started(A)
        d.submit(env.make(A))
        with caplog.at_level(logging.ERROR, logger="dispatcher.driver"):
            await env.execute.finish(A, error=ValueError("claude exploded"))
        assert "room-a" in caplog.text
        assert "claude exploded" in caplog.text
        await env.execute.finish(A)  # the queued message still runs
        assert d.tracked_rooms == 0


async def test_resubmitted_messages_run_again(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        m = env.make(A)
        d.submit(m)
        clock.advance(1.0)
        await env.execute.finish(A)
        d.submit(m)  # !retry
        clock.advance(1.0)
        await env.execute.finish(A)
    assert env.execute.batches[0].messages == env.execute.batches[1].messages == (m,)


async def test_messages_submitted_before_serving_run_when_it_starts() -> None:
    env = Env(limits(cap=1))
    d, clock = env.dispatcher, env.clock
    a, b = env.make(A), env.make(B)
    d.submit(a)
    clock.advance(0.5)
    d.submit(b)
    clock.advance(5.0)  # both windows closed while nobody served
    assert d.active_runs == 0
    assert d.queued == 2
    async with serving(d):
        call = await env.execute.started(A)  # A's window closed first
        assert call.batch.messages == (a,)
        assert d.status(B).waiting_for_slot
        await env.execute.finish(A)
        await env.execute.finish(B)


async def test_cancelling_serve_cancels_runs_and_waits_for_them(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    env.execute.slow_cleanup = True
    async with serving(d) as task:
        d.submit(env.make(A))
        d.submit(env.make(B))
        clock.advance(1.0)
        call_a = await env.execute.started(A)
        call_b = await env.execute.started(B)
        task.cancel()
        await env.execute.cancelled(call_a)
        await env.execute.cancelled(call_b)
        assert not task.done()  # serve waits for their cleanup
        d.submit(env.make(A))  # arrives during shutdown: stays pending
        assert call_a.cleanup_gate is not None
        assert call_b.cleanup_gate is not None
        call_a.cleanup_gate.set()
        call_b.cleanup_gate.set()
        async with asyncio.timeout(GUARD_S):
            await asyncio.wait([task])
        assert task.cancelled()
    assert d.active_runs == 0
    assert d.queued == 1
    assert len(env.execute.calls) == 2


async def test_serve_twice_at_once_is_refused(env: Env) -> None:
    async with serving(env.dispatcher):
        with pytest.raises(RuntimeError, match="already serving"):
            await env.dispatcher.serve()


async def test_wait_idle_returns_once_everything_ran(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        await d.wait_idle()  # nothing to do yet
        d.submit(env.make(A))
        waiter = asyncio.ensure_future(d.wait_idle())
        clock.advance(1.0)
        await env.execute.finish(A)
        async with asyncio.timeout(GUARD_S):
            await waiter
        assert d.active_runs == 0
        assert d.queued == 0


async def test_real_clock_runs_a_batch() -> None:
    """The monotonic clock and the loop's timers, with a zero window."""
    execute = FakeExecute(auto=True)
    d = Dispatcher(limits(coalesce=0.0, max_wait=0.0), execute, MonotonicClock())
    make = Messages()
    async with serving(d):
        m = make(A)
        d.submit(m)
        async with asyncio.timeout(GUARD_S):
            await d.wait_idle()
    assert execute.batches[0].messages == (m,)


async def test_real_clock_timer_fires() -> None:
    execute = FakeExecute(auto=True)
    d = Dispatcher(limits(coalesce=0.001, max_wait=0.01), execute, MonotonicClock())
    make = Messages()
    async with serving(d):
        d.submit(make(A))
        d.submit(make(A))
        async with asyncio.timeout(GUARD_S):
            await d.wait_idle()
    assert [len(b.messages) for b in execute.batches] == [2]


async def test_an_internal_error_in_a_timer_fails_serve(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug must not leave rooms silently wedged: serve() fails loudly instead."""

    def broken(now: float) -> list[object]:
        raise RuntimeError("scheduler bug")

    d = env.dispatcher
    ready = asyncio.Event()
    task = asyncio.ensure_future(d.serve(ready))
    try:
        async with asyncio.timeout(GUARD_S):
            await ready.wait()
        # Only a fault can be injected here: no real input makes the scheduler fail.
        monkeypatch.setattr(d._scheduler, "fire_timers", broken)
        d.submit(env.make(A))
        env.clock.advance(1.0)
        with pytest.raises(ExceptionGroup) as failure:
            async with asyncio.timeout(GUARD_S):
                await task
        assert failure.group_contains(RuntimeError, match="scheduler bug")
    finally:
        task.cancel()


async def test_stop_tells_the_run_it_was_stopped(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        d.submit(env.make(A))
        clock.advance(1.0)
        call = await env.execute.started(A)
        d.stop(A)
        await env.execute.cancelled(call)
        assert call.run.end_reason is EndReason.STOPPED


async def test_drain_lets_runs_finish_and_starts_nothing_new(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        d.submit(env.make(A))
        clock.advance(1.0)
        call = await env.execute.started(A)
        queued = env.make(A)
        d.submit(queued)
        drained = asyncio.ensure_future(d.drain(30.0))
        assert d.draining
        late = env.make(B)
        d.submit(late)  # arrives during the grace period: accepted, not started
        clock.advance(10.0)
        assert d.status(B).running is None
        await env.execute.finish(A)
        async with asyncio.timeout(GUARD_S):
            assert await drained
        assert call.run.end_reason is None
        assert len(env.execute.calls) == 1  # the queued message did not start
        assert d.queued == 2


@pytest.mark.parametrize("reason", [EndReason.INTERRUPTED, EndReason.DETACHED])
async def test_drain_cuts_off_runs_still_active_when_the_grace_ends(
    env: Env, reason: EndReason
) -> None:
    # INTERRUPTED by default; a detaching shutdown leaves them to their supervisors.
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        d.submit(env.make(A))
        clock.advance(1.0)
        call = await env.execute.started(A)
        cut = d.drain(5.0) if reason is EndReason.INTERRUPTED else d.drain(5.0, reason=reason)
        drained = asyncio.ensure_future(cut)
        clock.advance(5.0)
        await env.execute.cancelled(call)
        async with asyncio.timeout(GUARD_S):
            assert not await drained
        assert call.run.end_reason is reason
        assert d.active_runs == 0


async def test_drain_keeps_a_granted_run_that_has_not_begun(env: Env) -> None:
    d = env.dispatcher
    async with serving(d):
        msgs = [env.make(A) for _ in range(3)]  # max_batch: granted at once
        for m in msgs:
            d.submit(m)
        assert d.status(A).running is not None
        async with asyncio.timeout(GUARD_S):
            assert await d.drain(5.0)
        assert env.execute.calls == []
        assert d.queued == 3  # still waiting: pending in the store, run after a restart


async def test_cancelling_serve_interrupts_begun_runs(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    async with serving(d) as task:
        d.submit(env.make(A))
        clock.advance(1.0)
        call = await env.execute.started(A)
        task.cancel()
        await env.execute.cancelled(call)
    assert call.run.end_reason is EndReason.INTERRUPTED


@pytest.mark.parametrize("reason", [EndReason.INTERRUPTED, EndReason.DETACHED])
async def test_a_stop_while_a_cut_off_run_winds_down_makes_it_stopped(
    env: Env, reason: EndReason
) -> None:
    d, clock = env.dispatcher, env.clock
    env.execute.slow_cleanup = True
    async with serving(d):
        d.submit(env.make(A))
        clock.advance(1.0)
        call = await env.execute.started(A)
        drained = asyncio.ensure_future(d.drain(5.0, reason=reason))
        clock.advance(5.0)
        await env.execute.cancelled(call)
        assert call.run.end_reason is reason
        # Still winding down when the room says stop.
        assert d.stop(A) == StopResult(stopped=None, dropped=())
        assert end_reason(call) is EndReason.STOPPED
        assert call.cleanup_gate is not None
        call.cleanup_gate.set()
        async with asyncio.timeout(GUARD_S):
            assert not await drained
        assert end_reason(call) is EndReason.STOPPED


def end_reason(call: Call) -> EndReason | None:
    """Read afresh: mypy would keep the attribute narrowed across the stop."""
    return call.run.end_reason


# -- detaching shutdowns -------------------------------------------------------


async def test_a_cut_off_detaches_at_once(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        d.submit(env.make(A))
        clock.advance(1.0)
        call = await env.execute.started(A)
        cut_off = asyncio.Event()
        drained = asyncio.ensure_future(d.drain(30.0, cut_off, reason=EndReason.DETACHED))
        cut_off.set()
        await env.execute.cancelled(call)
        async with asyncio.timeout(GUARD_S):
            assert not await drained
        assert call.run.end_reason is EndReason.DETACHED


async def test_cancelling_serve_after_a_detaching_drain_detaches(env: Env) -> None:
    d, clock = env.dispatcher, env.clock
    async with serving(d) as task:
        d.submit(env.make(A))
        clock.advance(1.0)
        call = await env.execute.started(A)
        drained = asyncio.ensure_future(d.drain(30.0, reason=EndReason.DETACHED))
        task.cancel()  # before the grace ends
        await env.execute.cancelled(call)
    assert call.run.end_reason is EndReason.DETACHED
    async with asyncio.timeout(GUARD_S):
        await drained


def test_a_drain_does_not_stop_runs(env: Env) -> None:
    with pytest.raises(ValueError, match="stopped"):
        env.dispatcher.drain(1.0, reason=EndReason.STOPPED)
    assert not env.dispatcher.draining


# -- adopted runs --------------------------------------------------------------


def reattached(env: Env, key: RoomKey) -> Batch:
    """The batch of a run an earlier process started."""
    return Batch(key, (env.make(key),))


async def test_an_adopted_run_is_carried_on_by_its_own_execute(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    d = env.dispatcher
    async with serving(d):
        batch = reattached(env, A)
        d.adopt(batch, env.execute.adopted)
        assert d.status(A).running == batch
        assert d.active_runs == 1
        call = await env.execute.started(A)
        assert call.adopted
        assert call.batch == batch
        queued = env.make(A)
        d.submit(queued)
        with caplog.at_level(logging.ERROR, logger="dispatcher.driver"):
            await env.execute.finish(A, error=ValueError("supervisor gone"))
        assert "supervisor gone" in caplog.text  # a failed run, like any
        follow_up = await env.execute.started(A)
        assert not follow_up.adopted  # the dispatcher's own execute from here on
        assert follow_up.batch.messages == (queued,)
        await env.execute.finish(A)
        assert d.tracked_rooms == 0
        assert d.active_runs == 0
    assert env.execute.violations == []


async def test_a_run_adopted_before_serving_starts_with_serving_ahead_of_the_room() -> None:
    env = Env(limits(cap=1))
    d, clock = env.dispatcher, env.clock
    gathered = env.make(A)
    d.submit(gathered)
    clock.advance(5.0)  # its window closed before serving
    batch = reattached(env, A)
    d.adopt(batch, env.execute.adopted)
    late = env.make(A)
    d.submit(late)
    status = d.status(A)
    assert (status.running, status.waiting, status.waiting_for_slot) == (batch, 2, False)
    assert env.execute.calls == []
    async with serving(d):
        call = await env.execute.started(A)
        assert call.batch == batch
        await env.execute.finish(A)
        follow_up = await env.execute.started(A)
        assert follow_up.batch.messages == (gathered, late)  # one batch, at once
        await env.execute.finish(A)
    assert env.execute.batches == [batch, follow_up.batch]


async def test_an_adopted_run_may_exceed_the_cap_and_others_wait_below_it() -> None:
    env = Env(limits(cap=1))
    d, clock = env.dispatcher, env.clock
    async with serving(d):
        d.submit(env.make(A))
        clock.advance(1.0)
        await env.execute.started(A)
        d.adopt(reattached(env, B), env.execute.adopted)
        await env.execute.started(B)
        assert d.active_runs == 2
        d.submit(env.make(C))
        clock.advance(1.0)
        assert d.status(C).waiting_for_slot
        await env.execute.finish(A)
        assert d.status(C).waiting_for_slot  # one run active: still at the cap
        await env.execute.finish(B)
        await env.execute.finish(C)
    assert [call.batch.room for call in env.execute.calls] == [A, B, C]
    assert env.execute.violations == []


async def test_stop_cancels_an_adopted_run_and_drops_the_queue(env: Env) -> None:
    d = env.dispatcher
    async with serving(d):
        batch = reattached(env, A)
        d.adopt(batch, env.execute.adopted)
        call = await env.execute.started(A)
        queued = env.make(A)
        d.submit(queued)
        assert d.stop(A) == StopResult(stopped=batch, dropped=(queued,))
        await env.execute.ended(call)
        assert call.cancelled.is_set()
        assert call.run.end_reason is EndReason.STOPPED
        assert d.tracked_rooms == 0
        assert d.active_runs == 0


async def test_an_adopted_run_stopped_before_its_task_ran_still_hears_it(env: Env) -> None:
    d = env.dispatcher
    async with serving(d):
        batch = reattached(env, A)
        d.adopt(batch, env.execute.adopted)
        assert d.stop(A) == StopResult(stopped=batch, dropped=())  # in the same step
        async with asyncio.timeout(GUARD_S):
            await d.wait_idle()
    [call] = env.execute.calls
    assert call.cancelled.is_set()
    assert call.run.end_reason is EndReason.STOPPED


async def test_an_adopted_run_stopped_before_serving_hears_it_once_serving(env: Env) -> None:
    d = env.dispatcher
    batch = reattached(env, A)
    d.adopt(batch, env.execute.adopted)
    queued = env.make(A)
    d.submit(queued)
    assert d.stop(A) == StopResult(stopped=batch, dropped=(queued,))
    assert d.status(A).stopping
    async with serving(d):
        async with asyncio.timeout(GUARD_S):
            await d.wait_idle()
    [call] = env.execute.calls
    assert call.cancelled.is_set()
    assert call.run.end_reason is EndReason.STOPPED


async def test_a_drain_cuts_an_adopted_run_off_for_its_reason(env: Env) -> None:
    d = env.dispatcher
    async with serving(d):
        d.adopt(reattached(env, A), env.execute.adopted)
        call = await env.execute.started(A)
        drained = asyncio.ensure_future(d.drain(5.0, reason=EndReason.DETACHED))
        env.clock.advance(5.0)
        await env.execute.cancelled(call)
        async with asyncio.timeout(GUARD_S):
            assert not await drained
        assert call.run.end_reason is EndReason.DETACHED


async def test_adopt_is_refused_for_a_room_with_a_run_and_while_draining(env: Env) -> None:
    d = env.dispatcher
    async with serving(d):
        for _ in range(3):
            d.submit(env.make(A))  # max_batch: granted at once, not begun yet
        with pytest.raises(ValueError, match="already has a run"):
            d.adopt(reattached(env, A), env.execute.adopted)
        await env.execute.started(A)
        with pytest.raises(ValueError, match="already has a run"):
            d.adopt(reattached(env, A), env.execute.adopted)
        drained = asyncio.ensure_future(d.drain(5.0))
        with pytest.raises(RuntimeError, match="draining"):
            d.adopt(reattached(env, B), env.execute.adopted)
        await env.execute.finish(A)
        async with asyncio.timeout(GUARD_S):
            assert await drained
    assert len(env.execute.calls) == 1

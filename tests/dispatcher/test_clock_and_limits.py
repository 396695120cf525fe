"""The manual clock tests rely on, and the limits' validation."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from dispatcher import DispatchLimits, ManualClock, MonotonicClock
from dispatcher.clock import EARLY_S
from tests.dispatcher.fakes import GUARD_S


def test_manual_clock_runs_due_callbacks_in_time_order_at_their_time() -> None:
    clock = ManualClock(start=10.0)
    seen: list[tuple[str, float]] = []
    clock.call_at(12.0, lambda: seen.append(("b", clock.now())))
    clock.call_at(11.0, lambda: seen.append(("a", clock.now())))
    late = clock.call_at(13.0, lambda: seen.append(("c", clock.now())))
    clock.advance(2.5)
    assert seen == [("a", 11.0), ("b", 12.0)]
    assert clock.now() == 12.5
    assert clock.next_timer == 13.0
    late.cancel()
    assert clock.next_timer is None
    clock.advance(10.0)
    assert [name for name, _ in seen] == ["a", "b"]


def test_manual_clock_runs_callbacks_scheduled_by_callbacks_within_the_range() -> None:
    clock = ManualClock()
    seen: list[float] = []

    def chain() -> None:
        seen.append(clock.now())
        if len(seen) < 3:
            clock.call_at(clock.now() + 1.0, chain)

    clock.call_at(1.0, chain)
    clock.advance(5.0)
    assert seen == [1.0, 2.0, 3.0]


def test_manual_clock_past_deadlines_fire_on_the_next_advance() -> None:
    clock = ManualClock(start=5.0)
    seen: list[float] = []
    clock.call_at(1.0, lambda: seen.append(clock.now()))
    assert seen == []  # never synchronously from call_at
    clock.advance(0)
    assert seen == [5.0]
    clock.advance_to(4.0)  # the past: no-op
    assert clock.now() == 5.0
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)


def test_limits_from_configuration_milliseconds() -> None:
    limits = DispatchLimits.from_ms(
        coalesce_ms=1500, max_wait_ms=10_000, max_batch=20, max_concurrent_runs=4
    )
    assert limits == DispatchLimits(1.5, 10.0, 20, 4)


@pytest.mark.parametrize(
    ("coalesce", "max_wait", "max_batch", "cap"),
    [(-1.0, 1.0, 1, 1), (1.0, -1.0, 1, 1), (1.0, 1.0, 0, 1), (1.0, 1.0, 1, 0)],
)
def test_limits_reject_nonsense(coalesce: float, max_wait: float, max_batch: int, cap: int) -> None:
    with pytest.raises(ValueError, match="must"):
        DispatchLimits(coalesce, max_wait, max_batch, cap)


async def test_monotonic_clock_callbacks_never_run_before_their_time() -> None:
    # The loop is woken early (the selector rounds up); the clock waits out the rest.
    clock = MonotonicClock()
    seen: list[tuple[float, float]] = []
    done = asyncio.Event()

    def note(when: float) -> None:
        seen.append((when, time.monotonic()))

    for n in range(20):
        when = clock.now() + n * 0.0007
        clock.call_at(when, functools.partial(note, when))
    clock.call_at(clock.now() + 0.02, done.set)
    await asyncio.wait_for(done.wait(), GUARD_S)
    assert len(seen) == 20
    assert all(fired >= when for when, fired in seen)


async def test_a_monotonic_timer_cancelled_while_waiting_out_its_last_moments_never_runs() -> None:
    clock = MonotonicClock()
    fired: list[str] = []
    done = asyncio.Event()
    when = clock.now() + 0.01
    handle = clock.call_at(when, lambda: fired.append("cancelled one"))
    # Due before it, within the early wake-up: cancels it while it yields to the loop.
    clock.call_at(when - EARLY_S / 4, handle.cancel)
    clock.call_at(when + 0.01, done.set)
    await asyncio.wait_for(done.wait(), GUARD_S)
    assert fired == []

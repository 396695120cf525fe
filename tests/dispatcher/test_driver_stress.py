"""The driver under random load (many rooms, manual clock), and its memory."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import pytest

from bridge.core.model import Batch, Message, RoomKey
from dispatcher import DispatchedRun, Dispatcher, DispatchLimits, DuringRun, ManualClock
from tests.dispatcher.fakes import GUARD_S, FakeExecute, Messages, room, serving


@pytest.mark.parametrize("seed", range(6))
async def test_random_schedules_keep_the_invariants(seed: int) -> None:
    """Never two runs per room, cap kept (adopted runs count, and may go beyond
    it), no idle slot while a room waits, every message run, taken by steering
    or dropped exactly once and in order, also behind adopted runs; every
    prestart begun is taken by its run or cancelled once."""
    rng = random.Random(seed)
    limits = DispatchLimits(
        coalesce_s=rng.choice([0.0, 0.5, 1.0]),
        max_wait_s=rng.choice([1.0, 2.0]),
        max_batch=rng.randint(1, 4),
        max_concurrent_runs=rng.randint(1, 4),
    )
    log: list[tuple[RoomKey, tuple[Message, ...]]] = []
    clock = ManualClock()
    execute = FakeExecute(cap=limits.max_concurrent_runs, log=log)
    execute.steer_answer = lambda: rng.random() < 0.7
    rooms = [room(i) for i in range(30)]
    modes = {k: rng.choice(list(DuringRun)) for k in rooms}
    prestarter = BalancedPrestarter()

    async def taking_prestarts(run: DispatchedRun) -> None:
        if run.prestarted:
            prestarter.take(run.batch.room)  # as the bridge's execute does, first
        await execute(run)

    d = Dispatcher(
        limits,
        taking_prestarts,
        clock,
        mode_of=modes.__getitem__,
        prestarter=prestarter,
        max_prestarts=rng.randint(1, 3),
    )
    make = Messages()
    submitted: dict[RoomKey, list[Message]] = defaultdict(list)
    adopted: set[Batch] = set()

    def adopt() -> None:
        """A run an earlier process started, in a room without a run."""
        free = [k for k in rooms if d.status(k).running is None]
        if free:
            key = rng.choice(free)
            batch = Batch(key, (make(key, "earlier"),))
            adopted.add(batch)
            d.adopt(batch, execute.adopted)

    def check() -> None:
        assert execute.violations == []
        statuses = [d.status(k) for k in rooms]
        own = sum(s.running is not None and s.running not in adopted for s in statuses)
        assert own <= limits.max_concurrent_runs
        if any(s.waiting_for_slot for s in statuses):
            assert d.active_runs >= limits.max_concurrent_runs
        assert d.queued == sum(s.waiting for s in statuses)
        assert d.active_runs == sum(s.running is not None for s in statuses)

    for _ in range(rng.randint(0, limits.max_concurrent_runs + 1)):
        adopt()  # reattached at start-up, before serving
    async with serving(d):
        for _ in range(1500):
            op = rng.random()
            if op < 0.45:
                earlier = [m for msgs in submitted.values() for m in msgs]
                retry = earlier and rng.random() < 0.1
                message = rng.choice(earlier) if retry else make(rng.choice(rooms))
                submitted[message.room].append(message)
                d.submit(message)
            elif op < 0.65:
                clock.advance(rng.choice([0.1, 0.25, 0.5, 1.0]))
            elif op < 0.92:
                # Runs that will call execute (stopped ones end on their own).
                live = [k for k in rooms if d.status(k).running and not d.status(k).stopping]
                if live:
                    key = rng.choice(live)
                    error = RuntimeError("boom") if rng.random() < 0.1 else None
                    await execute.finish(key, error)
            elif op < 0.94:
                adopt()
            else:
                key = rng.choice(rooms)
                result = d.stop(key)
                if result.stopped is not None:
                    call = execute.active.get(key)
                    if call is None:  # adopted, its execute not reached yet: hears it then
                        assert result.stopped in adopted
                    else:
                        assert call.batch == result.stopped
                if result.dropped:
                    log.append((key, result.dropped))
            check()

        execute.release_all()
        clock.advance(1000.0)
        async with asyncio.timeout(GUARD_S):
            await d.wait_idle()
        check()

    for key in rooms:
        ran_or_dropped = [m for k, msgs in log if k == key for m in msgs]
        assert ran_or_dropped == submitted[key]
    assert d.tracked_rooms == 0
    assert execute.violations == []
    assert prestarter.held == set()
    assert prestarter.errors == []


class BalancedPrestarter:
    """Checks that each begun prestart ends once (cancelled, or taken by its run)."""

    def __init__(self) -> None:
        self.held: set[RoomKey] = set()
        self.errors: list[str] = []
        self.begun = 0

    def begin(self, room: RoomKey) -> None:
        self.begun += 1
        if room in self.held:
            self.errors.append(f"two prestarts for {room}")
        self.held.add(room)

    def cancel(self, room: RoomKey, why: str) -> None:
        if room not in self.held:
            self.errors.append(f"cancelled a prestart {room} does not hold ({why})")
        self.held.discard(room)

    def take(self, room: RoomKey) -> None:
        if room not in self.held:
            self.errors.append(f"a run of {room} took a prestart not held")
        self.held.discard(room)


async def test_rooms_that_went_idle_leave_no_state() -> None:
    clock = ManualClock()
    execute = FakeExecute(auto=True)
    d = Dispatcher(DispatchLimits(0.5, 1.0, 10, 8), execute, clock)
    make = Messages()
    async with serving(d):
        for i in range(10_000):
            d.submit(make(room(i)))
        assert d.tracked_rooms == 10_000
        clock.advance(1.0)
        await d.wait_idle()
        assert d.tracked_rooms == 0
        assert clock.next_timer is None  # the timer heap is empty too
    assert len(execute.calls) == 10_000

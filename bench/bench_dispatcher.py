"""Dispatcher micro-benchmarks: flush overhead, memory per room, submit throughput.

Flush overhead is measured from where a room's wait ends (its batch filled,
or its window's deadline) to ``execute`` called, the timer's own lateness
included. Memory per room is measured in each state a room can hold, at its
peak with every room busy, and after going idle.

Run: ``python bench/bench_dispatcher.py`` (about 30 s). Prints one table.
The figures are for this machine and Python; compare runs, not absolutes.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bridge.core.model import (
    ExternalMessageId,
    Message,
    MessageId,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from dispatcher import DispatchedRun, Dispatcher, DispatchLimits, MonotonicClock, TimerHandle

ROWS: list[tuple[str, str]] = []


def row(name: str, value: str) -> None:
    ROWS.append((name, value))
    print(f"  {name:<64} {value}", flush=True)


def room(n: int) -> RoomKey:
    return RoomKey(TransportName("console"), RoomId(f"!room{n}:example.org"))


def messages(count: int, rooms: int) -> Iterator[Message]:
    for n in range(count):
        yield Message(
            id=MessageId(n),
            room=room(n % rooms),
            sender=UserId("@alice:example.org"),
            text="hello",
            external_id=ExternalMessageId(f"$ev{n}"),
            received_at=0.0,
        )


async def no_op(run: DispatchedRun) -> None:
    return None


@asynccontextmanager
async def serving(dispatcher: Dispatcher) -> AsyncIterator[None]:
    ready = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        task = group.create_task(dispatcher.serve(ready))
        await ready.wait()
        try:
            yield
        finally:
            task.cancel()


def percentiles(samples_ns: list[float]) -> str:
    q = statistics.quantiles(samples_ns, n=100)
    return f"p50 {q[49] / 1000:7.1f} us   p99 {q[98] / 1000:7.1f} us   (n={len(samples_ns)})"


async def flush_overhead_max_batch(samples: int, idle_gap: float = 0.0) -> None:
    """submit() of the message that fills a batch -> execute called.

    With ``idle_gap`` the loop sleeps before each sample, as it does before a
    timer fires: caches go cold, which costs more than the dispatcher does.
    """
    called: asyncio.Future[int] | None = None

    async def execute(run: DispatchedRun) -> None:
        assert called is not None
        called.set_result(time.perf_counter_ns())

    limits = DispatchLimits(coalesce_s=1.0, max_wait_s=5.0, max_batch=1, max_concurrent_runs=64)
    d = Dispatcher(limits, execute, MonotonicClock())
    deltas: list[float] = []
    async with serving(d):
        for message in messages(samples, rooms=100):
            if idle_gap:
                await asyncio.sleep(idle_gap)
            called = asyncio.get_running_loop().create_future()
            t0 = time.perf_counter_ns()
            d.submit(message)
            deltas.append(await called - t0)
        await d.wait_idle()
    label = f", after {idle_gap * 1000:g} ms idle" if idle_gap else ""
    row(f"flush overhead, batch full{label}: submit -> execute", percentiles(deltas))


class RecordingClock(MonotonicClock):
    """The real clock, noting the deadline each timer was set for and when it fired."""

    def __init__(self) -> None:
        self.asked_for = 0.0
        self.fired_at = 0.0

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        self.asked_for = when

        def fire() -> None:
            self.fired_at = time.monotonic()
            callback()

        return super().call_at(when, fire)


async def flush_overhead_timer(samples: int, coalesce: float) -> None:
    """Window closes -> execute called: what a room waits beyond its window.

    The deadline is the one the dispatcher set its timer for (the window's
    end); the total is split into the loop's timer lateness (deadline ->
    callback: the epoll timeout is rounded to whole milliseconds, and a busy
    loop runs the callback later still) and ours (callback -> execute).
    """
    called: asyncio.Future[float] | None = None

    async def execute(run: DispatchedRun) -> None:
        assert called is not None
        called.set_result(time.monotonic())

    limits = DispatchLimits(coalesce, max_wait_s=1.0, max_batch=10, max_concurrent_runs=64)
    clock = RecordingClock()
    d = Dispatcher(limits, execute, clock)
    total: list[float] = []
    loop_late: list[float] = []
    ours: list[float] = []
    async with serving(d):
        for message in messages(samples, rooms=100):
            called = asyncio.get_running_loop().create_future()
            d.submit(message)
            deadline = clock.asked_for
            at = await called
            total.append((at - deadline) * 1e9)
            loop_late.append((clock.fired_at - deadline) * 1e9)
            ours.append((at - clock.fired_at) * 1e9)
        await d.wait_idle()
    window = f"{coalesce * 1000:g} ms window"
    row(f"flush overhead, {window} closed: deadline -> execute", percentiles(total))
    row("  of which asyncio timer lateness: deadline -> timer callback", percentiles(loop_late))
    row("  of which the dispatcher: timer callback -> execute", percentiles(ours))


async def measure(setup: Callable[[], Awaitable[None]]) -> int:
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    await setup()
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before


async def memory_per_room(rooms: int) -> None:
    # Messages are created before measuring: they belong to the store, not
    # to the dispatcher; what is measured is the dispatcher's own state.
    pending = list(messages(rooms, rooms))
    tracemalloc.start()
    try:
        used_limits = DispatchLimits(1.0, 5.0, max_batch=1, max_concurrent_runs=64)
        used = Dispatcher(used_limits, no_op, MonotonicClock())

        async def use_and_go_idle() -> None:
            async with serving(used):
                for m in pending:
                    used.submit(m)
                await used.wait_idle()

        # A first dispatcher serves one run so one-time allocations are not
        # charged to rooms (a dispatcher serves once: its end drains it).
        warm = Dispatcher(used_limits, no_op, MonotonicClock())
        async with serving(warm):
            warm.submit(pending[0])
            await warm.wait_idle()
        grown = await measure(use_and_go_idle)
        assert used.tracked_rooms == 0
        row(f"memory per room that ran and went idle ({rooms} rooms)", f"{grown / rooms:7.1f} B")

        gathering = Dispatcher(DispatchLimits(60.0, 60.0, 10, 64), no_op, MonotonicClock())

        async def open_batches() -> None:
            for m in pending:
                gathering.submit(m)

        grown = await measure(open_batches)
        assert gathering.tracked_rooms == rooms
        row(f"memory per room with 1 message in an open batch ({rooms})", f"{grown / rooms:7.1f} B")

        waiting = Dispatcher(DispatchLimits(60.0, 60.0, 1, 64), no_op, MonotonicClock())

        async def wait_for_slots() -> None:
            for m in pending:  # not serving: every room waits for a slot
                waiting.submit(m)

        grown = await measure(wait_for_slots)
        assert waiting.status(room(0)).waiting_for_slot
        row(
            f"memory per room with 1 message waiting for a slot ({rooms})",
            f"{grown / rooms:7.1f} B",
        )
    finally:
        tracemalloc.stop()


async def memory_per_room_busy(rooms: int) -> None:
    """Memory per room at its peak: every room running a batch, the next message queued.

    Every room gets a run at once (one slot per room), each run holds until
    all are going, and meanwhile each room gets a second message, which waits
    behind its run. Measured at that point, as tracemalloc's peak over the
    whole cycle (submit, run, next batch, idle), and after going idle. The
    run's task is counted (the dispatcher creates it); its ``execute`` does
    nothing but wait.
    """
    first = list(messages(rooms, rooms))
    second = [
        Message(
            id=MessageId(rooms + m.id),
            room=m.room,
            sender=m.sender,
            text=m.text,
            external_id=ExternalMessageId(f"$next{m.id}"),
            received_at=0.0,
        )
        for m in first
    ]
    release = asyncio.Event()
    all_running = asyncio.Event()
    started = 0

    async def execute(run: DispatchedRun) -> None:
        nonlocal started
        started += 1
        if started == rooms:
            all_running.set()
        await release.wait()

    limits = DispatchLimits(60.0, 60.0, max_batch=1, max_concurrent_runs=rooms)
    warm = Dispatcher(limits, no_op, MonotonicClock())
    async with serving(warm):  # one-time allocations, as in memory_per_room
        warm.submit(first[0])
        await warm.wait_idle()
    d = Dispatcher(limits, execute, MonotonicClock())
    tracemalloc.start()
    try:
        async with serving(d):
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            for m in first:
                d.submit(m)
            await all_running.wait()
            for m in second:
                d.submit(m)
            gc.collect()
            busy = tracemalloc.get_traced_memory()[0] - before
            assert d.active_runs == rooms
            release.set()
            await d.wait_idle()
            peak = tracemalloc.get_traced_memory()[1] - before
            gc.collect()
            left = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert started == 2 * rooms
    row(f"memory per room, busy: a run going + 1 queued ({rooms})", f"{busy / rooms:7.1f} B")
    row(f"memory per room, peak over the busy cycle ({rooms})", f"{peak / rooms:7.1f} B")
    row(f"memory per room, left after that cycle went idle ({rooms})", f"{left / rooms:7.1f} B")


async def throughput(count: int, rooms: int) -> None:
    limits = DispatchLimits(coalesce_s=0.05, max_wait_s=0.5, max_batch=10, max_concurrent_runs=8)
    d = Dispatcher(limits, no_op, MonotonicClock())
    batch = list(messages(count, rooms))
    async with serving(d):
        t0 = time.perf_counter()
        for m in batch:
            d.submit(m)
        t1 = time.perf_counter()
        await d.wait_idle()
        t2 = time.perf_counter()
    row(f"submit() rate, {count} messages over {rooms} rooms", f"{count / (t1 - t0):10,.0f} msg/s")
    row(
        f"submit to all runs done, same load (batches of {limits.max_batch})",
        f"{count / (t2 - t0):10,.0f} msg/s",
    )


async def main() -> None:
    print(f"dispatcher bench, Python {sys.version.split()[0]}")
    await flush_overhead_max_batch(20_000)
    await flush_overhead_max_batch(2_000, idle_gap=0.001)
    await flush_overhead_timer(2_000, coalesce=0.001)
    await flush_overhead_timer(200, coalesce=0.05)
    await memory_per_room(10_000)
    await memory_per_room_busy(10_000)
    await throughput(200_000, 1_000)


if __name__ == "__main__":
    asyncio.run(main())

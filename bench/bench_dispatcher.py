"""Dispatcher micro-benchmarks: flush overhead, memory per room, submit throughput.

Run: ``python bench/bench_dispatcher.py`` (about 10 s). Prints one table.
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
    """The real clock, noting when each timer callback actually fired."""

    def __init__(self) -> None:
        self.fired_at = 0.0

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        def fire() -> None:
            self.fired_at = time.monotonic()
            callback()

        return super().call_at(when, fire)


async def flush_overhead_timer(samples: int) -> None:
    """Window closes -> execute called; split into the loop's timer latency and ours."""
    coalesce = 0.001
    called: asyncio.Future[float] | None = None

    async def execute(run: DispatchedRun) -> None:
        assert called is not None
        called.set_result(time.monotonic())

    limits = DispatchLimits(coalesce, max_wait_s=1.0, max_batch=10, max_concurrent_runs=64)
    clock = RecordingClock()
    d = Dispatcher(limits, execute, clock)
    loop_late: list[float] = []
    ours: list[float] = []
    async with serving(d):
        for message in messages(samples, rooms=100):
            called = asyncio.get_running_loop().create_future()
            deadline = clock.now() + coalesce
            d.submit(message)
            at = await called
            loop_late.append((clock.fired_at - deadline) * 1e9)
            ours.append((at - clock.fired_at) * 1e9)
        await d.wait_idle()
    row("flush overhead, window closed: timer callback -> execute", percentiles(ours))
    row("  (asyncio timer lateness: deadline -> timer callback)", percentiles(loop_late))


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

        # Serve once first so one-time allocations are not charged to rooms.
        async with serving(used):
            pass
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
    await flush_overhead_timer(2_000)
    await memory_per_room(10_000)
    await throughput(200_000, 1_000)


if __name__ == "__main__":
    asyncio.run(main())

"""The outbox worker against a transport that fails on demand (a test double of Transport).

The worker's promises: a room's entries arrive in recording order, every
part exactly once, whatever the transport raises in between; rate limits
are waited out as the server asked; a refused entry is given up and the
room goes on; a restart resumes at the parts already done.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.core.model import (
    ExternalMessageId,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
)
from bridge.core.transport import (
    Delivery,
    Duplex,
    RateLimited,
    Transport,
    TransportError,
    Undeliverable,
)
from bridge.metrics import Metrics
from bridge.outbound.outbox import Outbox
from bridge.store.base import OutboxEntry, Store
from bridge.store.memory import MemoryStore
from bridge.store.sql import SqlStore
from tests.fakes.flaky_store import FlakyStore

MATRIX = TransportName("matrix")
ROOMS = [RoomKey(MATRIX, RoomId(f"!{name}:localhost")) for name in ("a", "b", "c")]

Fault = Callable[[], Exception] | None


class Scripted(Duplex):
    """Posts each reply as parts split at ``|``; raises the scripted faults first."""

    name = MATRIX

    def __init__(self, faults: Sequence[Fault] = ()) -> None:
        self.faults: deque[Fault] = deque(faults)
        self.posted: list[tuple[RoomKey, str]] = []
        self.keys: list[tuple[str, int]] = []

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        assert delivery is not None
        parts = reply.text.split("|")
        last = None
        for index in range(delivery.parts_done, len(parts)):
            fault = self.faults.popleft() if self.faults else None
            if fault is not None:
                raise fault()
            await asyncio.sleep(0)  # other rooms' deliveries interleave here
            self.posted.append((reply.room, parts[index]))
            self.keys.append((delivery.key, index))
            last = ExternalMessageId(f"${len(self.posted)}")
            await delivery.part_sent(index, last)
        return last


def reply(room: RoomKey, text: str) -> Reply:
    return Reply(room=room, text=text, kind=ReplyKind.RESULT)


class Sleeps:
    """The worker's sleep: records each pause and returns at once."""

    def __init__(self) -> None:
        self.pauses: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)
        await asyncio.sleep(0)


@asynccontextmanager
async def serving(outbox: Outbox) -> AsyncIterator[Outbox]:
    task = asyncio.create_task(outbox.serve())
    try:
        yield outbox
    finally:
        task.cancel()
        await asyncio.wait({task})


def new_outbox(
    store: Store,
    transport: Transport,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    metrics: Metrics | None = None,
    rate_limits: list[tuple[TransportName, float]] | None = None,
) -> Outbox:
    limits = rate_limits if rate_limits is not None else []
    return Outbox(
        store,
        {MATRIX: transport},
        metrics or Metrics(),
        on_rate_limited=lambda name, after: limits.append((name, after)),
        sleep=sleep or Sleeps(),
    )


def transient() -> Exception:
    return TransportError("matrix", "502 bad gateway")


def limited() -> Exception:
    return RateLimited("matrix", 7.0)


def refused() -> Exception:
    return Undeliverable("matrix", "not a member of the room")


async def test_a_rooms_answers_arrive_in_order_each_part_once() -> None:
    store = MemoryStore()
    transport = Scripted([None, transient, None, limited, transient, None])
    entries = await store.enqueue(
        [reply(ROOMS[0], "1a|1b|1c"), reply(ROOMS[0], "2a"), reply(ROOMS[0], "3a|3b")], 1.0
    )
    async with serving(new_outbox(store, transport)) as outbox:
        await outbox.submit(entries)()
    assert [text for _, text in transport.posted] == ["1a", "1b", "1c", "2a", "3a", "3b"]
    assert len(set(transport.keys)) == len(transport.keys)
    assert await store.undelivered() == []


async def test_a_rate_limit_is_waited_out_as_the_server_asked() -> None:
    store = MemoryStore()
    sleeps = Sleeps()
    rate_limits: list[tuple[TransportName, float]] = []
    transport = Scripted([limited])
    outbox = new_outbox(store, transport, sleep=sleeps, rate_limits=rate_limits)
    async with serving(outbox):
        await outbox.submit(await store.enqueue([reply(ROOMS[0], "hi")], 1.0))()
    assert sleeps.pauses == [7.0]
    assert rate_limits == [(MATRIX, 7.0)]
    assert transport.posted == [(ROOMS[0], "hi")]


async def test_a_refused_answer_is_given_up_and_the_room_goes_on() -> None:
    store = MemoryStore()
    metrics = Metrics()
    transport = Scripted([refused])
    entries = await store.enqueue([reply(ROOMS[0], "lost"), reply(ROOMS[0], "next")], 1.0)
    async with serving(new_outbox(store, transport, metrics=metrics)) as outbox:
        await outbox.submit(entries)()
    assert transport.posted == [(ROOMS[0], "next")]
    assert await store.undelivered() == []
    exposition = metrics.exposition().decode()
    assert 'chatbridge_deliveries_total{outcome="failed"} 1.0' in exposition


async def test_a_restart_resumes_at_the_parts_done(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'outbox.db'}"
    store = await SqlStore.open(url)
    crashed = asyncio.Event()

    async def crash(seconds: float) -> None:
        # The process dies while it waits to try again.
        crashed.set()
        await asyncio.Event().wait()

    first = Scripted([None, None, transient])
    [entry] = await store.enqueue([reply(ROOMS[0], "p0|p1|p2|p3")], 1.0)
    async with serving(new_outbox(store, first, sleep=crash)) as outbox:
        outbox.submit([entry])
        await crashed.wait()
    await store.close()
    assert [text for _, text in first.posted] == ["p0", "p1"]

    store = await SqlStore.open(url)
    try:
        [left] = await store.undelivered()
        assert (left.parts_done, left.key) == (2, entry.key)
        second = Scripted()
        outbox = new_outbox(store, second)
        async with serving(outbox):
            # Nothing is handed over: the worker finds the entry on its own.
            await wait_until_delivered(store)
        assert [text for _, text in second.posted] == ["p2", "p3"]
        assert second.keys == [(entry.key, 2), (entry.key, 3)]
    finally:
        await store.close()


async def wait_until_delivered(store: Store) -> None:
    while await store.undelivered():
        await asyncio.sleep(0.01)


async def test_an_entry_handed_over_twice_is_delivered_once() -> None:
    store = MemoryStore()
    transport = Scripted()
    entries = await store.enqueue([reply(ROOMS[0], "once")], 1.0)
    outbox = new_outbox(store, transport)
    outbox.submit(entries)  # before serve: serve's own read of the outbox finds it too
    async with serving(outbox):
        await outbox.submit(entries)()
    assert transport.posted == [(ROOMS[0], "once")]


async def test_a_stale_pending_copy_of_a_delivered_entry_is_not_sent_again() -> None:
    """A replica's poll reads pending entries, then hands them over: one delivered in
    between comes back as a stale copy (its state still pending), never a second post."""
    store = MemoryStore()
    transport = Scripted()
    stale = await store.enqueue([reply(ROOMS[0], "once")], 1.0)
    outbox = new_outbox(store, transport)
    async with serving(outbox):
        await outbox.submit(stale)()
        await outbox.submit(stale)()
    assert transport.posted == [(ROOMS[0], "once")]


async def test_drain_waits_for_the_queue_within_its_bound() -> None:
    store = MemoryStore()

    async def forever(seconds: float) -> None:
        await asyncio.Event().wait()

    outbox = new_outbox(store, Scripted([transient]), sleep=forever)
    async with serving(outbox):
        outbox.submit(await store.enqueue([reply(ROOMS[0], "stuck")], 1.0))
        assert await outbox.drain(0.05) is False
    assert len(await store.undelivered()) == 1


async def test_drain_includes_what_earlier_runs_left() -> None:
    store = MemoryStore()
    await store.enqueue([reply(ROOMS[1], "left over")], 1.0)
    transport = Scripted()
    outbox = new_outbox(store, transport)
    async with serving(outbox):
        # Right away: the worker has not read the outbox yet.
        assert await outbox.drain(10.0) is True
        assert transport.posted == [(ROOMS[1], "left over")]


async def test_a_failing_store_never_repeats_a_part() -> None:
    flaky = FlakyStore(MemoryStore())
    store = flaky.store
    transport = Scripted()
    [entry] = await store.enqueue([reply(ROOMS[0], "a|b|c")], 1.0)
    flaky.fail("delivery_progress", times=1)  # recording part 0 fails
    flaky.fail("delivery_finished", times=2)
    async with serving(new_outbox(store, transport)) as outbox:
        await outbox.submit([entry])()
    assert [text for _, text in transport.posted] == ["a", "b", "c"]
    assert await store.undelivered() == []
    assert flaky.failures["delivery_finished"] == 2


class HoldsRoom(Scripted):
    """Room a's server hangs until released; the others answer at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        if reply.room == ROOMS[0]:
            await self.release.wait()
        return await super().send(reply, delivery)


async def test_rooms_are_delivered_in_parallel() -> None:
    store = MemoryStore()
    transport = HoldsRoom()
    held, free = await store.enqueue([reply(ROOMS[0], "held"), reply(ROOMS[1], "free")], 1.0)
    async with serving(new_outbox(store, transport)) as outbox:
        outbox.submit([held])
        await outbox.submit([free])()
        assert transport.posted == [(ROOMS[1], "free")]
        transport.release.set()
        await outbox.submit([held])()
    assert transport.posted == [(ROOMS[1], "free"), (ROOMS[0], "held")]


FAULTS = st.sampled_from([None, None, transient, limited, refused])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3)), min_size=1, max_size=8),
    faults=st.lists(FAULTS, max_size=20),
)
def test_per_room_order_and_exactly_once_under_any_faults(
    plan: list[tuple[int, int]], faults: list[Fault]
) -> None:
    """Whatever fails, each room sees its delivered entries' parts in order, each once."""

    async def scenario() -> None:
        store = MemoryStore()
        transport = Scripted(faults)
        replies = [
            reply(ROOMS[room], "|".join(f"{n}.{p}" for p in range(parts)))
            for n, (room, parts) in enumerate(plan)
        ]
        outbox = new_outbox(store, transport)
        async with serving(outbox):
            entries: list[OutboxEntry] = []
            for r in replies:  # recorded one by one, as runs end
                entries += await store.enqueue([r], 1.0)
                outbox.submit(entries[-1:])
            await outbox.submit(entries)()
        assert await store.undelivered() == []
        assert len(set(transport.keys)) == len(transport.keys)
        for room in ROOMS:
            seen = [text for r, text in transport.posted if r == room]
            expected = [
                part
                for r in replies
                if r.room == room
                for part in r.text.split("|")
                if part in seen
            ]
            assert seen == expected
            # An entry given up may lack its tail, never a part in the middle.
            for r in replies:
                if r.room == room:
                    got = [p for p in r.text.split("|") if p in seen]
                    assert got == r.text.split("|")[: len(got)]
        # Only a refusal leaves an entry incomplete.
        used = faults[: len(faults) - len(transport.faults)]
        incomplete = [
            r
            for r in replies
            if not all((r.room, p) in transport.posted for p in r.text.split("|"))
        ]
        assert len(incomplete) <= sum(1 for f in used if f is refused)

    asyncio.run(scenario())


async def test_an_answer_recorded_during_the_start_up_read_waits_for_older_ones() -> None:
    flaky = FlakyStore(MemoryStore())
    store = flaky.store
    await store.enqueue([reply(ROOMS[0], "old")], 1.0)
    flaky.fail("undelivered", times=1)  # the start-up read is retried after a pause
    paused = asyncio.Event()
    resume = asyncio.Event()

    async def sleep(seconds: float) -> None:
        paused.set()
        await resume.wait()

    transport = Scripted()
    async with serving(new_outbox(store, transport, sleep=sleep)) as outbox:
        await paused.wait()
        # A run of the same room ends while the read waits to try again.
        settled = outbox.submit(await store.enqueue([reply(ROOMS[0], "new")], 2.0))
        resume.set()
        await settled()
    assert transport.posted == [(ROOMS[0], "old"), (ROOMS[0], "new")]


async def test_an_answer_for_a_transport_not_configured_stays_pending() -> None:
    store = MemoryStore()
    elsewhere = RoomKey(TransportName("slack"), RoomId("C1"))
    [kept] = await store.enqueue([reply(elsewhere, "for slack")], 1.0)
    transport = Scripted()
    async with serving(new_outbox(store, transport)) as outbox:
        await outbox.submit(await store.enqueue([reply(ROOMS[0], "for matrix")], 2.0))()
        assert await outbox.drain(10.0) is True
    assert transport.posted == [(ROOMS[0], "for matrix")]
    assert [e.id for e in await store.undelivered()] == [kept.id]


class HangsOnce(Scripted):
    """The first attempt hangs like a server that never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.hung = asyncio.Event()

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        if not self.hung.is_set():
            self.hung.set()
            await asyncio.Event().wait()
        return await super().send(reply, delivery)


async def test_a_hung_attempt_is_given_up_and_retried() -> None:
    store = MemoryStore()
    transport = HangsOnce()
    metrics = Metrics()
    outbox = new_outbox(store, transport, metrics=metrics)
    outbox.send_timeout_s = 0.05
    async with serving(outbox):
        await outbox.submit(await store.enqueue([reply(ROOMS[0], "at last")], 1.0))()
    assert transport.posted == [(ROOMS[0], "at last")]
    assert 'chatbridge_deliveries_total{outcome="retried"} 1.0' in metrics.exposition().decode()


class BuggyBookkeeping:
    """The real store, except that recording attempts and ends raises a bug's error."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def delivery_attempted(self, entry_id: int, next_attempt_at: float) -> None:
        raise RuntimeError("a bug recording an attempt")

    async def delivery_finished(self, *args: object) -> None:
        raise RuntimeError("a bug recording the end")


async def test_a_bug_in_the_bookkeeping_does_not_end_the_outbox() -> None:
    inner = MemoryStore()
    store = cast(Store, BuggyBookkeeping(inner))
    transport = Scripted([transient])
    outbox = new_outbox(store, transport)
    task = asyncio.create_task(outbox.serve())
    try:
        await outbox.submit(await store.enqueue([reply(ROOMS[0], "a")], 1.0))()
        await outbox.submit(await store.enqueue([reply(ROOMS[1], "b")], 2.0))()
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.wait({task})
    assert transport.posted == [(ROOMS[0], "a"), (ROOMS[1], "b")]

"""Prestarts kept warm after a run (``prestart_keep_s``), with a fake ``start``: which
claude the room's next run gets, and that every other one is stopped and counted."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace
from pathlib import Path
from typing import cast

from bridge.assembly import open_store
from bridge.core.model import ReplyKind, RoomId, RoomKey, RunId, SessionId, TransportName
from bridge.metrics import Metrics
from bridge.runs.prestarts import Prestarts
from bridge.service import Service
from runner import Prestarted, RunRequest
from runner.process import find_marked
from tests.bridge.chat_room import GUARD_S, ChatRoom, console_room
from tests.bridge.harness import ECHO
from tests.bridge.timeline import settings
from tests.runner.conftest import gone

WAIT_S = 5.0
"""Each wait ends on an event; the bound only turns a hang into a failure."""

A, B, C = (RoomKey(TransportName("console"), RoomId(f"room-{n}")) for n in "abc")
SESSION = SessionId("s-1")


class FakeClaude:
    """What the fake ``start`` returns: ready at once, cancelled on an event."""

    def __init__(self, request: RunRequest) -> None:
        self.request = replace(request, prompt="", images=())
        self.ready: asyncio.Task[bool] = asyncio.create_task(_true())
        self.cancelled = asyncio.Event()

    def matches(self, request: RunRequest) -> bool:
        return replace(request, prompt="", images=()) == self.request

    async def cancel(self) -> None:
        self.cancelled.set()


async def _true() -> bool:
    return True


class Fixture:
    def __init__(self, keep_s: float = 3600.0, keep_limit: int = 4) -> None:
        self.metrics = Metrics()
        self.session: SessionId | None = SESSION
        self.started: list[FakeClaude] = []
        ids = itertools.count(1)
        self.prestarts = Prestarts(
            self.request_for,
            self.metrics,
            lambda: RunId(f"run-{next(ids)}"),
            start=self.start,
            keep_s=keep_s,
            keep_limit=keep_limit,
        )

    async def request_for(self, room: RoomKey, run_id: RunId) -> RunRequest:
        return self.request(run_id)

    def request(self, run_id: RunId, prompt: str = "") -> RunRequest:
        return RunRequest(run_id, "claude", Path("/tmp"), prompt, self.session)

    async def start(self, request: RunRequest) -> Prestarted:
        claude = FakeClaude(request)
        self.started.append(claude)
        return cast(Prestarted, claude)

    def count(self, outcome: str, why: str = "") -> float:
        value: float = self.metrics.prestarts.labels(outcome, why)._value.get()
        return value

    async def all_stopped(self) -> None:
        await self.prestarts.close()

    async def started_in(self, room: RoomKey) -> FakeClaude:
        """The claude the room's prestart started (once its request was read)."""
        claude = await self.prestarts._rooms[room].task
        assert claude is not None
        return cast(FakeClaude, claude)


async def test_the_rooms_next_run_gets_the_claude_kept_warm_after_its_last() -> None:
    f = Fixture()
    f.prestarts.keep_warm(A)
    taken = f.prestarts.take(A)
    assert taken is not None
    assert taken.run_id == RunId("run-1")  # allotted when kept: the run's id
    got = await taken.prestarted(f.request(taken.run_id, "hello"))
    assert got is cast(Prestarted, f.started[0])
    assert f.count("used") == 1
    assert f.prestarts.take(A) is None  # taken once


async def test_one_nobody_takes_is_stopped_when_its_time_is_up() -> None:
    f = Fixture(keep_s=0.001)
    f.prestarts.keep_warm(A)
    async with asyncio.timeout(WAIT_S):
        claude = await f.started_in(A)
        await claude.cancelled.wait()
    assert f.count("wasted", "expired") == 1
    assert f.prestarts.take(A) is None  # nothing left
    await f.all_stopped()
    assert f.count("wasted", "shutdown") == 0


async def test_one_taken_or_adopted_no_longer_expires() -> None:
    f = Fixture()
    f.prestarts.keep_warm(A)
    f.prestarts.keep_warm(B)
    expiries = {room: f.prestarts._rooms[room].expiry for room in (A, B)}
    assert f.prestarts.take(A) is not None
    f.prestarts.begin(B)  # the dispatcher's prestart for B: the warm one, not a second
    assert all(e is not None and e.cancelled() for e in expiries.values())
    await f.started_in(B)
    assert len(f.started) == 2
    # B's is the dispatcher's now: its cancel stops it (and no eviction counts it).
    for room in "cd":
        f.prestarts.keep_warm(RoomKey(TransportName("console"), RoomId(f"room-{room}")))
    f.prestarts.cancel(B, "dropped")
    await f.all_stopped()
    assert f.count("wasted", "dropped") == 1
    assert f.count("wasted", "evicted") == 0


async def test_at_most_keep_limit_are_kept_the_oldest_goes() -> None:
    f = Fixture(keep_limit=2)
    for room in (A, B, C):
        f.prestarts.keep_warm(room)
    assert f.count("wasted", "evicted") == 1
    assert f.prestarts.take(A) is None  # the oldest went
    async with asyncio.timeout(WAIT_S):
        await f.prestarts.close()
    assert [c.request.run_id for c in f.started if c.cancelled.is_set()] == [
        RunId("run-1"),
        RunId("run-2"),
        RunId("run-3"),
    ]
    assert f.count("wasted", "shutdown") == 2


async def test_a_run_for_another_session_gets_none_and_it_is_stopped() -> None:
    f = Fixture()
    f.prestarts.keep_warm(A)
    await f.started_in(A)  # started with the session the run left
    taken = f.prestarts.take(A)
    assert taken is not None
    f.session = None  # a !reset since
    assert await taken.prestarted(f.request(taken.run_id, "hello")) is None
    assert f.started[0].cancelled.is_set()
    assert f.count("wasted", "changed") == 1
    assert f.count("used") == 0


async def test_a_room_let_go_stops_its_warm_one_before_the_lease_goes() -> None:
    f = Fixture()
    f.prestarts.keep_warm(A)
    f.prestarts.keep_warm(B)
    async with asyncio.timeout(WAIT_S):
        await f.prestarts.release(A)
    assert f.started[0].cancelled.is_set()  # gone once release returns
    f.prestarts.let_go(B)
    f.prestarts.let_go(C)  # nothing kept for C: nothing happens
    assert f.count("wasted", "released") == 2
    assert f.prestarts.take(B) is None


async def test_a_room_let_go_keeps_the_dispatchers_prestart() -> None:
    f = Fixture()
    f.prestarts.begin(A)  # a batch's, not kept warm: the dispatcher ends it
    f.prestarts.let_go(A)
    assert f.count("wasted", "released") == 0
    assert f.prestarts.take(A) is not None


async def test_nothing_is_kept_when_off_at_shutdown_or_beside_a_prestart() -> None:
    off = Fixture(keep_s=0.0)
    off.prestarts.keep_warm(A)
    assert off.prestarts.take(A) is None
    f = Fixture()
    f.prestarts.begin(A)
    f.prestarts.keep_warm(A)  # (the room has one already)
    f.prestarts.keep_warm(B)
    await f.prestarts.stop_keeping()
    assert f.count("wasted", "shutdown") == 1  # B's
    f.prestarts.keep_warm(C)
    assert f.prestarts.take(C) is None
    taken = f.prestarts.take(A)
    assert taken is not None
    assert taken.run_id == RunId("run-1")
    await taken.give_up("dropped")
    await f.all_stopped()
    assert len(f.started) <= 2


async def test_a_cancelled_service_stops_the_claude_it_kept_warm(tmp_path: Path) -> None:
    """A serve cancelled (or failed) before its shutdown ran stops the claude it kept
    warm for a room. Was: that prestart's task was no run's and only the shutdown
    closed it, so the claude lived on until its supervisor's orphan timeout."""
    config = settings(tmp_path, {"runner": {"prestart": True, "prestart_keep_s": 600}}, ECHO)
    room = console_room(config)
    chat = ChatRoom(room, "local")
    store = await open_store(config)
    try:
        service = Service(config, store, [chat])
        task = asyncio.ensure_future(service.serve())
        await service.ready.wait()
        await chat.say("hello")
        await chat.wait_until(lambda: any("hello" in t for t in chat.texts(ReplyKind.RESULT)))
        prestarts = service.parts.executor.prestarts
        assert prestarts is not None
        async with asyncio.timeout(GUARD_S):
            while room not in prestarts._warm:  # kept warm once the run ended
                await asyncio.sleep(0.01)
            marker = prestarts._warm[room].run_id
            while not (pids := find_marked(marker)):
                await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.wait({task})
        for pid in pids:
            assert await gone(pid, GUARD_S), f"the warm claude {pid} still runs"
    finally:
        await store.close()

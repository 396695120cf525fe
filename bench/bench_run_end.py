"""20 runs ending at once: claude's result line to the answer handed to the transport.

The whole service in-process (dispatcher, runner with its supervisor, outbox)
with a transport that records when each answer reaches it, 20 rooms, and the
fake claude (tests/fakes/fake_claude.py). Each round sends one message to
every room; the 20 fake claudes start, print their first lines and wait for
one shared trigger file; the bench creates it and all 20 print their result
together. The fake stamps ``time.monotonic()`` (system-wide on Linux) just
after its result line and just before it exits, so both sides use one clock.

Printed, p50/p90/p99 over all runs: result line -> answer at the transport;
claude's exit -> answer (negative: the answer was there before claude had
exited; claude stays ``--linger-ms`` after its result, default 200, as a CLI
that flushes before it exits); and how long each run's ``finish_run`` (the outcome with the answer,
one transaction) took, to show what the store costs. Once with SQLite on disk
(the real fsync) and once with the in-memory store (the bridge's own cost).

    python bench/bench_run_end.py [--rooms 20] [--rounds 5] [--linger-ms 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).parents[1]))

from bridge.config import Settings
from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.transport import Delivery, Duplex, InboundSink, RunPhase
from bridge.service import Service
from bridge.store.base import RunEnding, Store
from bridge.store.memory import MemoryStore
from bridge.store.sql import SqlStore
from tests.fakes.fake_claude import install

MATRIX = TransportName("matrix")
GUARD_S = 120.0
"""A round that takes longer than this has hung: fail instead of waiting forever."""


class Rooms(Duplex):
    """Stands in for Matrix: hands the service messages, records when answers arrive."""

    name = MATRIX

    def __init__(self) -> None:
        self.sink: InboundSink | None = None
        self.answers: dict[str, float] = {}
        """Answer text -> time.monotonic() when the transport got it."""
        self.done: dict[RoomKey, int] = {}
        """Runs whose end the room was shown (the last cosmetic step)."""
        self.running: dict[RoomKey, int] = {}
        """Runs the room was shown as running: claude was spawned."""
        self.changed = asyncio.Event()
        self._ids = 0

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        self.sink = sink
        ready.set()
        await asyncio.Event().wait()

    async def say(self, room: RoomKey, text: str) -> None:
        assert self.sink is not None
        self._ids += 1
        external_id = ExternalMessageId(f"in-{self._ids}")
        await self.sink(InboundMessage(room, UserId("@user:x"), text, external_id))

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        if reply.kind is ReplyKind.RESULT:
            self.answers[reply.text] = time.monotonic()
            self.changed.set()
        return ExternalMessageId(f"out-{len(self.answers)}")

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        if phase is RunPhase.RECEIVED:
            return
        seen = self.running if phase is RunPhase.RUNNING else self.done
        seen[room] = seen.get(room, 0) + 1
        self.changed.set()

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(GUARD_S):
            while not done():
                self.changed.clear()
                await self.changed.wait()


class TimedStore:
    """The store, timing each ``finish_run`` (the outcome with the answer)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.finish_s: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def finish_run(self, ending: RunEnding) -> Any:
        start = time.monotonic()
        try:
            return await self._store.finish_run(ending)
        finally:
            self.finish_s.append(time.monotonic() - start)


def settings(tmp: Path, rooms: int, trigger: Path, times: Path, linger_s: float) -> Settings:
    claude = install(tmp)
    return Settings(
        console={"enabled": False},
        matrix={"homeserver": "http://127.0.0.1:1", "user_id": "@b:x", "access_token": "t"},
        runner={"claude_bin": str(claude), "max_concurrent_runs": rooms, "stop_grace_s": 5.0},
        dispatcher={"coalesce_ms": 0},
        http={"listen": ""},
        defaults={
            "cwd": tmp,
            "allowed_users": ["*"],
            "env": {
                "FAKE_CLAUDE_ECHO": "1",
                "FAKE_CLAUDE_NO_TOOL": "1",
                "FAKE_CLAUDE_WAIT_FOR": str(trigger),
                "FAKE_CLAUDE_TIMES": str(times),
                "FAKE_CLAUDE_LINGER": str(linger_s),
            },
        },
        rooms=[{"transport": "matrix", "id": f"!room-{i}"} for i in range(rooms)],
    )


def at_least(counts: dict[RoomKey, int], n: int) -> Callable[[], bool]:
    return lambda: sum(counts.values()) >= n


def room_key(i: int) -> RoomKey:
    return RoomKey(MATRIX, RoomId(f"!room-{i}"))


async def measure(
    tmp: Path, store: Store, rooms: int, rounds: int, linger_s: float
) -> tuple[list[float], list[float], list[float]]:
    trigger, times = tmp / "answer-now", tmp / "times.jsonl"
    config = settings(tmp, rooms, trigger, times, linger_s)
    transport = Rooms()
    timed = TimedStore(store)
    service = Service(config, cast(Store, timed), [transport])
    result_to_answer: list[float] = []
    exit_to_answer: list[float] = []
    async with asyncio.TaskGroup() as tasks:
        serving = tasks.create_task(service.serve())
        await service.ready.wait()
        for n in range(rounds):
            expected = (n + 1) * rooms
            trigger.unlink(missing_ok=True)
            for i in range(rooms):
                await transport.say(room_key(i), f"ping {n} room {i}")
            # Every claude spawned; give them a moment to reach the trigger (a
            # late one only ends a little later: each run is measured on its own).
            await transport.until(at_least(transport.running, expected))
            await asyncio.sleep(0.5)
            trigger.touch()
            await transport.until(at_least(transport.done, expected))
        service.request_stop()
        await serving
    for line in times.read_text().splitlines():
        stamp = json.loads(line)
        answered = transport.answers[stamp["prompt"]]
        result_to_answer.append(answered - stamp["result"])
        exit_to_answer.append(answered - stamp["exit"])
    return result_to_answer, exit_to_answer, timed.finish_s


def percentiles(samples_s: list[float]) -> str:
    cuts = statistics.quantiles([s * 1000 for s in samples_s], n=100, method="inclusive")
    return f"p50 {cuts[49]:7.1f}  p90 {cuts[89]:7.1f}  p99 {cuts[98]:7.1f} ms"


async def bench(rooms: int, rounds: int, linger_s: float) -> None:
    print(
        f"{rooms} runs ending at once, {rounds} rounds ({rooms * rounds} runs per store);"
        f" claude exits {linger_s * 1000:g} ms after its result line"
    )
    for name in ("sqlite (file)", "memory"):
        with tempfile.TemporaryDirectory(prefix="bench-run-end-") as tmp_name:
            tmp = Path(tmp_name)
            store: Store
            if name == "memory":
                store = MemoryStore()
            else:
                store = await SqlStore.open(f"sqlite+aiosqlite:///{tmp / 'bridge.db'}")
            try:
                to_answer, from_exit, finish = await measure(tmp, store, rooms, rounds, linger_s)
            finally:
                await store.close()
        before_exit = sum(1 for s in from_exit if s < 0)
        print(f"  {name}")
        print(f"    result line -> answer at the transport: {percentiles(to_answer)}")
        print(f"    claude exit -> answer at the transport: {percentiles(from_exit)}")
        print(f"    answers there before claude exited:     {before_exit}/{len(from_exit)}")
        print(f"    finish_run (outcome + answer, 1 txn):   {percentiles(finish)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rooms", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--linger-ms", type=float, default=200, help="claude's time from its result to its exit"
    )
    args = parser.parse_args()
    asyncio.run(bench(args.rooms, args.rounds, args.linger_ms / 1000))


if __name__ == "__main__":
    main()

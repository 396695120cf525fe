"""The bridge's memory with many rooms: RSS of the whole service (in this process).

The service runs with 1,000 configured Matrix rooms and a transport that
only hands messages over (no homeserver), the fake claude and SQLite. RSS is
read: before the service, once it serves (1,000 rooms configured, all idle),
once 100 of them each have a message waiting in an open window (the window
is made long enough to stay open; prestart on, its claudes are separate
processes, counted apart), and once those 100 messages ran and every room is
idle again.

    python bench/bench_rooms_memory.py [--rooms 1000] [--active 100]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parents[1]))

from bridge.config import Settings
from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    Reply,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.transport import Accepted, Delivery, Duplex, InboundSink
from bridge.service import Service, open_store
from tests.fakes.fake_claude import FAKE_CLAUDE

MATRIX = TransportName("matrix")


class Feeder(Duplex):
    """A transport named matrix that hands over what the bench gives it."""

    name = MATRIX

    def __init__(self) -> None:
        self.sink: InboundSink | None = None
        self.answers = 0
        self.answered = asyncio.Event()

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        self.sink = sink
        ready.set()
        await asyncio.Event().wait()

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        self.answers += 1
        self.answered.set()
        return ExternalMessageId(f"answer-{self.answers}")


def rss_mib(pid: int | None = None) -> float:
    return psutil.Process(pid or os.getpid()).memory_info().rss / 2**20


def children_mib() -> tuple[int, float]:
    procs = psutil.Process().children(recursive=True)
    total = 0.0
    for proc in procs:
        try:
            total += proc.memory_info().rss / 2**20
        except psutil.Error:
            continue
    return len(procs), total


def settings(tmp: Path, rooms: int, window_ms: int) -> Settings:
    return Settings(
        console={"enabled": False},
        matrix={"homeserver": "http://127.0.0.1:1", "user_id": "@b:x", "access_token": "t"},
        runner={"claude_bin": str(FAKE_CLAUDE), "state_dir": tmp / "state"},
        dispatcher={"coalesce_ms": window_ms, "max_wait_ms": window_ms},
        database={"url": f"sqlite+aiosqlite:///{tmp / 'bridge.db'}"},
        http={"listen": ""},
        defaults={
            "cwd": tmp,
            "env": {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_NO_TOOL": "1"},
            "follow_typing": False,  # the long window stays open
        },
        rooms=[
            {"transport": "matrix", "id": f"!room-{i}", "allowed_users": ["*"]}
            for i in range(rooms)
        ],
    )


async def main(rooms: int, active: int) -> None:
    load = f"load {os.getloadavg()[0]:.2f}"
    with tempfile.TemporaryDirectory(prefix="bench-rooms-") as tmp_name:
        tmp = Path(tmp_name)
        gc.collect()
        before = rss_mib()
        window_s = 20.0
        config = settings(tmp, rooms, int(window_s * 1000))
        store = await open_store(config)
        feeder = Feeder()
        service = Service(config, store, [feeder])
        serving = asyncio.create_task(service.serve())
        try:
            await asyncio.wait_for(service.ready.wait(), 60)
            await asyncio.sleep(1.0)  # the first spare supervisor settles
            idle = rss_mib()
            assert feeder.sink is not None
            for i in range(active):
                key = RoomKey(MATRIX, RoomId(f"!room-{i}"))
                inbound = InboundMessage(
                    key, UserId("@u:x"), f"hello {i}", ExternalMessageId(f"m{i}")
                )
                assert await feeder.sink(inbound) is Accepted.ACCEPTED
            await asyncio.sleep(2.0)  # prestarts start
            waiting = rss_mib()
            count, child_rss = children_mib()
            assert service.parts.dispatcher.tracked_rooms == active
            async with asyncio.timeout(window_s + 120):
                while feeder.answers < active:
                    feeder.answered.clear()
                    await feeder.answered.wait()
                await service.parts.dispatcher.wait_idle()
            gc.collect()
            after = rss_mib()
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            await store.close()
    print(f"bridge RSS, MiB ({rooms} Matrix rooms configured; {load})")
    print(f"  before the service                          {before:7.1f}")
    print(f"  serving, every room idle                    {idle:7.1f}")
    print(
        f"  {active} rooms with a message in an open window   {waiting:7.1f}"
        f"   (+ {count} child processes, {child_rss:.1f} MiB: prestarts, supervisors)"
    )
    print(f"  after their {active} runs, every room idle again  {after:7.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rooms", type=int, default=1000)
    parser.add_argument("--active", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.rooms, args.active))

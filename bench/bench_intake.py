"""Messages/s accepted across 1,000 rooms through the whole accept path.

authorize -> commit to the store -> dispatcher.submit, with a no-op run, on
the in-memory store (the service's own overhead), SQLite (file, WAL) and,
when CHATBRIDGE_TEST_POSTGRES_URL is set, PostgreSQL.

The in-memory store never waits, so its acceptors would run one after
another (the first one would take every message before the others start):
the bench's memory store yields to the loop once per accept, as a real
store's commit does. Every run reports how many accepts were in flight at
once at most, which shows whether the acceptors interleaved.

    python bench/bench_intake.py [--messages N] [--rooms N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from bridge.config import Settings
from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    Message,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.inbound.commands import CommandHandler
from bridge.inbound.intake import Intake
from bridge.metrics import Metrics
from bridge.store.base import Store
from bridge.store.memory import MemoryStore
from bridge.store.sql import SqlStore
from dispatcher import DispatchedRun, Dispatcher, DispatchLimits


class YieldingMemoryStore(MemoryStore):
    """The in-memory store with one await point per accept, as a commit has."""

    async def accept(self, msg: InboundMessage, received_at: float) -> Message | None:
        await asyncio.sleep(0)
        return await super().accept(msg, received_at)


class InFlight:
    """Counts accepts under way; ``most`` is the largest number at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    def __enter__(self) -> None:
        self.now += 1
        self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        self.now -= 1


def settings(rooms: int) -> Settings:
    # Rooms of a configured transport; the bench starts no transport.
    return Settings(
        console={"enabled": False},
        matrix={"homeserver": "http://127.0.0.1:1", "user_id": "@b:x", "access_token": "t"},
        rooms=[
            {"transport": "matrix", "id": f"!room-{i}", "allowed_users": ["*"]}
            for i in range(rooms)
        ],
    )


@asynccontextmanager
async def postgres_store(admin_url: str) -> AsyncIterator[Store]:
    import asyncpg

    name = f"chatbridge_bench_{uuid.uuid4().hex[:8]}"
    dsn = admin_url.replace("postgresql+asyncpg", "postgresql")
    conn = await asyncpg.connect(dsn)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    store = await SqlStore.open(admin_url.rsplit("/", 1)[0] + f"/{name}")
    try:
        yield store
    finally:
        await store.close()
        conn = await asyncpg.connect(dsn)
        await conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await conn.close()


async def measure(
    store: Store, rooms: int, messages: int, concurrency: int
) -> tuple[float, float, float, int]:
    config = settings(rooms)

    async def execute(run: DispatchedRun) -> None:
        return None

    # Long windows: measure accepting, not running.
    dispatcher = Dispatcher(DispatchLimits(60.0, 600.0, 10_000, 4), execute)
    commands = CommandHandler(
        dispatcher,
        store,
        "!",
        answer=lambda message, text: asyncio.sleep(0),
        reset_session=lambda room: store.set_session(room, None),
    )
    intake = Intake(config, store, dispatcher, commands, Metrics())
    keys = [RoomKey(TransportName("matrix"), RoomId(f"!room-{i}")) for i in range(rooms)]
    run = uuid.uuid4().hex[:6]
    inbound = [
        InboundMessage(
            keys[i % rooms], UserId("u"), f"message {i}", ExternalMessageId(f"{run}-{i}")
        )
        for i in range(messages)
    ]
    latencies: list[float] = []
    queue = iter(inbound)
    in_flight = InFlight()

    async def worker() -> None:
        for message in queue:
            t0 = time.perf_counter()
            with in_flight:
                await intake.accept(message)
            latencies.append(time.perf_counter() - t0)

    async with asyncio.TaskGroup() as tg:
        serve = tg.create_task(dispatcher.serve())
        start = time.perf_counter()
        async with asyncio.TaskGroup() as workers:
            for _ in range(concurrency):
                workers.create_task(worker())
        elapsed = time.perf_counter() - start
        serve.cancel()
    qs = statistics.quantiles(latencies, n=100)
    return messages / elapsed, qs[49] * 1e3, qs[98] * 1e3, in_flight.most


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rooms", type=int, default=1000)
    args = parser.parse_args()
    print(f"accept path, {args.messages} messages over {args.rooms} rooms")
    print(
        f"{'store':<12} {'acceptors':>9} {'msg/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'most at once':>12}"
    )
    backends: list[tuple[str, object]] = [("memory", None), ("sqlite", None)]
    pg = os.environ.get("CHATBRIDGE_TEST_POSTGRES_URL")
    if pg:
        backends.append(("postgresql", pg))
    for name, url in backends:
        for concurrency in (1, 50):
            with tempfile.TemporaryDirectory() as tmp:
                if name == "memory":
                    store: Store = YieldingMemoryStore()
                    result = await measure(store, args.rooms, args.messages, concurrency)
                elif name == "sqlite":
                    store = await SqlStore.open(f"sqlite+aiosqlite:///{tmp}/bench.db")
                    try:
                        result = await measure(store, args.rooms, args.messages, concurrency)
                    finally:
                        await store.close()
                else:
                    async with postgres_store(str(url)) as store:
                        result = await measure(store, args.rooms, args.messages, concurrency)
            rate, p50, p99, most = result
            print(
                f"{name:<12} {concurrency:>9} {rate:>9.0f} {p50:>8.2f} {p99:>8.2f} {most:>12}",
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main())

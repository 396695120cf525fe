"""Throughput and commit latency of ``Store.accept`` on SQLite and PostgreSQL.

Usage: ``python bench/bench_store.py [--postgres-url URL] [--seconds S]``

Each phase accepts fresh messages until it has done ``--count`` or used
``--seconds``, whichever comes first, so the whole run stays under a minute.
"Sequential" is one acceptor awaiting each commit; "concurrent" is
``--acceptors`` tasks doing the same at once. Latency is per ``accept`` call
(the transport waits this long before acknowledging upstream).

SQLite runs on a file in a temporary directory (WAL, synchronous=FULL).
PostgreSQL runs in a temporary database created under the admin URL (default:
``$CHATBRIDGE_TEST_POSTGRES_URL`` or the local trust-auth server), dropped at
the end; if the server cannot be reached that row is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url

from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.store.sql import SqlStore

DEFAULT_POSTGRES = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
ROOM = RoomKey(TransportName("console"), RoomId("bench"))


@dataclass(frozen=True)
class Result:
    backend: str
    mode: str
    messages: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    def percentile(self, p: float) -> float:
        """The p-th percentile latency in milliseconds."""
        cuts = statistics.quantiles(self.latencies, n=100, method="inclusive")
        return cuts[round(p) - 1] * 1000


class Ids:
    """Fresh external ids for the whole run (no redelivery in the bench)."""

    def __init__(self) -> None:
        self._next = 0

    def take(self) -> ExternalMessageId:
        self._next += 1
        return ExternalMessageId(f"$bench-{self._next}")


async def acceptor(
    store: SqlStore, ids: Ids, remaining: list[int], deadline: float, latencies: list[float]
) -> None:
    """Accept messages until the shared budget or the time is used up."""
    while remaining[0] > 0 and time.perf_counter() < deadline:
        remaining[0] -= 1
        msg = InboundMessage(ROOM, UserId("bench"), "x" * 200, ids.take())
        began = time.perf_counter()
        accepted = await store.accept(msg, time.time())
        latencies.append(time.perf_counter() - began)
        assert accepted is not None


async def phase(
    store: SqlStore, ids: Ids, *, acceptors: int, count: int, seconds: float
) -> tuple[float, list[float]]:
    """Run ``acceptors`` tasks; returns the elapsed time and every latency."""
    latencies: list[float] = []
    remaining = [count]
    began = time.perf_counter()
    deadline = began + seconds
    async with asyncio.TaskGroup() as group:
        for _ in range(acceptors):
            group.create_task(acceptor(store, ids, remaining, deadline, latencies))
    return time.perf_counter() - began, latencies


@asynccontextmanager
async def sqlite_url() -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory(prefix="bench-store-") as directory:
        yield f"sqlite+aiosqlite:///{Path(directory) / 'bench.db'}"


@asynccontextmanager
async def postgres_url(admin_url: str) -> AsyncIterator[str]:
    dsn = make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"chatbridge_bench_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def bench_backend(backend: str, url: str, args: argparse.Namespace) -> list[Result]:
    """The sequential and the concurrent phase on one fresh database."""
    store = await SqlStore.open(url)
    ids = Ids()  # shared by both phases: every message is new
    results = []
    try:
        modes = (("sequential", 1), (f"{args.acceptors} concurrent", args.acceptors))
        for mode, acceptors in modes:
            elapsed, latencies = await phase(
                store, ids, acceptors=acceptors, count=args.count, seconds=args.seconds
            )
            results.append(Result(backend, mode, len(latencies), elapsed, latencies))
    finally:
        await store.close()
    return results


async def main(args: argparse.Namespace) -> None:
    results: list[Result] = []
    async with sqlite_url() as url:
        results += await bench_backend("sqlite (file, WAL)", url, args)
    try:
        async with postgres_url(args.postgres_url) as url:
            results += await bench_backend("postgresql", url, args)
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"postgresql skipped: {exc}")

    header = (
        f"{'backend':<20} {'mode':<15} {'messages':>8} {'msg/s':>8} {'p50 ms':>8} {'p99 ms':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.backend:<20} {r.mode:<15} {r.messages:>8} {r.rate:>8.0f}"
            f" {r.percentile(50):>8.2f} {r.percentile(99):>8.2f}"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("CHATBRIDGE_TEST_POSTGRES_URL", DEFAULT_POSTGRES),
        help="admin URL; a temporary database is created under it",
    )
    parser.add_argument("--count", type=int, default=3000, help="messages per phase at most")
    parser.add_argument("--seconds", type=float, default=8.0, help="time per phase at most")
    parser.add_argument("--acceptors", type=int, default=50, help="concurrent acceptors")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))

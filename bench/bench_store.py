"""The store on a run's critical path, on SQLite and PostgreSQL.

Usage: ``python bench/bench_store.py [--postgres-url URL] [--seconds S]``

Accept: each phase accepts fresh messages until it has done ``--count`` or
used ``--seconds``, whichever comes first, so the whole run stays under a
minute. "Sequential" is one acceptor awaiting each commit; "concurrent" is
``--acceptors`` tasks doing the same at once. Latency is per ``accept`` call
(the transport waits this long before acknowledging upstream).

Per run: ``--runs`` runs one after another, each the store calls a plain
run makes in order (accept, get_session, start_run, register_live_run,
finish_run with its answer), timed per step and in all. "as built" is the
store as it is; "all synced" is the same store made to commit every write
with a disk sync and to read on the writer connection, as it did before
(the difference is what those choices save per run).

Reads beside writes: a room's session read (``get_session``, before every
run) over and over while ``--acceptors`` tasks accept messages, in slices
taking turns between "as built" (reader connections) and "all synced"
(reads on the writer, queued behind its commits).

Runs ending together: ``--burst`` runs finish at once (``asyncio.gather``),
``--bursts`` times; latency is per ``finish_run`` call (the answer waits
this long), "round" the time until the last one returned. "grouped" is the
store as built (one transaction for the runs queued behind the first);
"one by one" limits its group commit to one run per transaction.

SQLite runs on a file in a temporary directory (WAL; synchronous=FULL but for
the start of a run, see bridge/store/sql/runs.py).
PostgreSQL runs in a temporary database created under the admin URL (default:
``$CHATBRIDGE_TEST_POSTGRES_URL`` or the local trust-auth server), dropped at
the end; if the server cannot be reached that row is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import asyncpg
from sqlalchemy.engine import Engine, make_url

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    LiveRun,
    Reply,
    RoomId,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
    SessionId,
    TransportName,
    UserId,
)
from bridge.store.base import RunEnding
from bridge.store.batching import GroupCommit
from bridge.store.engine import is_sqlite
from bridge.store.sql import SqlStore
from bridge.store.transactions import Body, OnDriver, Transactions

T = TypeVar("T")

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

    def message(self) -> InboundMessage:
        return InboundMessage(ROOM, UserId("bench"), "x" * 200, self.take())

    def run(self) -> RunId:
        self._next += 1
        return RunId(f"run-{self._next}")


def ms(latencies: list[float], p: float) -> float:
    """The p-th percentile of ``latencies`` (seconds), in milliseconds."""
    if len(latencies) < 2:
        return latencies[0] * 1000 if latencies else float("nan")
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return cuts[round(p) - 1] * 1000


PATH_STEPS = ("accept", "get_session", "start_run", "register_live_run", "finish_run", "run")


@dataclass(frozen=True)
class PathResult:
    backend: str
    variant: str
    steps: dict[str, list[float]]


async def run_path(store: SqlStore, ids: Ids, runs: int) -> dict[str, list[float]]:
    """``runs`` plain runs in sequence; the latency of each store call, and in all."""
    steps: dict[str, list[float]] = {step: [] for step in PATH_STEPS}
    for _ in range(runs):
        run_id = ids.run()
        began = time.perf_counter()
        msg = await store.accept(ids.message(), time.time())
        assert msg is not None
        accepted = time.perf_counter()
        await store.get_session(ROOM)
        read = time.perf_counter()
        await store.start_run(run_id, Batch(ROOM, (msg,)), time.time())
        started = time.perf_counter()
        where = LiveRun(run_id, 4240, 2**40, 4242, f"/var/lib/chatbridge/runs/{run_id}", "host")
        await store.register_live_run(where, time.time())
        registered = time.perf_counter()
        report = RunReport(RunStatus.SUCCEEDED, session_id=SessionId("bench"))
        await store.finish_run(
            RunEnding(run_id, report, time.time(), [Reply(ROOM, "the answer")], keep_session=True)
        )
        ended = time.perf_counter()
        marks = (began, accepted, read, started, registered, ended)
        for step, (a, b) in zip(PATH_STEPS, itertools.pairwise(marks), strict=False):
            steps[step].append(b - a)
        steps["run"].append(ended - began)
    return steps


class AllSynced:
    """Transactions as the store made them before 2026-11-23: every commit synced,
    reads on the writer."""

    def __init__(self, inner: Transactions) -> None:
        self._inner = inner

    @property
    def engine(self) -> Engine:
        return self._inner.engine

    async def write(
        self, body: Body[T], *, synced: bool = True, committing: Callable[[], None] | None = None
    ) -> T:
        return await self._inner.write(body, committing=committing)

    async def read(self, body: Body[T]) -> T:
        return await self._inner.write(body)

    async def close(self) -> None:
        await self._inner.close()


def all_synced(store: SqlStore) -> None:
    """Make ``store`` behave as before: every commit synced, reads on the writer."""
    store._tx = AllSynced(store._tx)


def on_driver(store: SqlStore) -> None:
    """Make ``store`` run its transactions on aiosqlite, as it did on a SQLite
    file before 2026-11-27 (in threads of its own since)."""
    store._tx = OnDriver(store.engine)


async def reads_beside_writes(
    store: SqlStore, ids: Ids, acceptors: int, seconds: float
) -> list[float]:
    """``get_session`` latencies while ``acceptors`` tasks accept for ``seconds``."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def reader() -> None:
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            await store.get_session(ROOM)
            latencies.append(time.perf_counter() - began)

    async with asyncio.TaskGroup() as group:
        for _ in range(acceptors):
            group.create_task(acceptor(store, ids, [10**9], deadline, []))
        group.create_task(reader())
    return latencies


@dataclass(frozen=True)
class BurstResult:
    backend: str
    variant: str
    latencies: list[float]
    rounds: list[float]


async def finish_bursts(store: SqlStore, ids: Ids, size: int, bursts: int) -> BurstResult:
    """``bursts`` times: start ``size`` runs, then finish them all at once."""
    latencies: list[float] = []
    rounds: list[float] = []
    for _ in range(bursts):
        runs = []
        for _ in range(size):
            msg = await store.accept(ids.message(), time.time())
            assert msg is not None
            run_id = ids.run()
            await store.start_run(run_id, Batch(ROOM, (msg,)), time.time())
            runs.append(run_id)

        async def finish(run_id: RunId, began: float) -> None:
            report = RunReport(RunStatus.SUCCEEDED)
            await store.finish_run(
                RunEnding(run_id, report, time.time(), [Reply(ROOM, "the answer")])
            )
            latencies.append(time.perf_counter() - began)

        began = time.perf_counter()
        await asyncio.gather(*(finish(r, began) for r in runs))
        rounds.append(time.perf_counter() - began)
    return BurstResult("", "", latencies, rounds)


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


@dataclass
class Measured:
    accepts: list[Result]
    paths: list[PathResult]
    bursts: list[BurstResult]
    reads: list[tuple[str, str, list[float]]]


async def bench_backend(backend: str, url: str, args: argparse.Namespace, into: Measured) -> None:
    """Every phase on one fresh database.

    The variants take turns run by run (and burst by burst), each through a
    store of its own on the same database, so that a drift of the machine
    or of the database's size weighs on both alike.
    """
    ids = Ids()  # shared by every phase: every message and run is new
    built = await SqlStore.open(url)
    before = await SqlStore.open(url, auto_migrate=False)
    # SQLite only: the same store on the asyncio driver.
    driven = await SqlStore.open(url, auto_migrate=False) if is_sqlite(url) else None
    try:
        modes = (("sequential", 1), (f"{args.acceptors} concurrent", args.acceptors))
        for mode, acceptors in modes:
            elapsed, latencies = await phase(
                built, ids, acceptors=acceptors, count=args.count, seconds=args.seconds
            )
            into.accepts.append(Result(backend, mode, len(latencies), elapsed, latencies))
        all_synced(before)
        variants = [("as built", built), ("all synced", before)]
        if driven is not None:
            on_driver(driven)
            variants.append(("on aiosqlite", driven))
        paths: dict[str, dict[str, list[float]]] = {
            variant: {step: [] for step in PATH_STEPS} for variant, _ in variants
        }
        for _ in range(args.runs):
            for variant, store in variants:
                for step, latencies in (await run_path(store, ids, 1)).items():
                    paths[variant][step] += latencies
        into.paths += [PathResult(backend, variant, steps) for variant, steps in paths.items()]
        reads: dict[str, list[float]] = {"as built": [], "all synced": []}
        for _ in range(4):
            for store, variant in ((built, "as built"), (before, "all synced")):
                reads[variant] += await reads_beside_writes(
                    store, ids, args.acceptors, args.seconds / 8
                )
        into.reads += [(backend, variant, latencies) for variant, latencies in reads.items()]
        before._finishes = GroupCommit(before._finish_group, limit=1)
        grouped = BurstResult(backend, "grouped", [], [])
        alone = BurstResult(backend, "one by one", [], [])
        for _ in range(args.bursts):
            for store, into_burst in ((built, grouped), (before, alone)):
                burst = await finish_bursts(store, ids, args.burst, 1)
                into_burst.latencies.extend(burst.latencies)
                into_burst.rounds.extend(burst.rounds)
        into.bursts += [grouped, alone]
    finally:
        await built.close()
        await before.close()
        if driven is not None:
            await driven.close()


async def main(args: argparse.Namespace) -> None:
    measured = Measured([], [], [], [])
    async with sqlite_url() as url:
        await bench_backend("sqlite (file, WAL)", url, args, measured)
    try:
        async with postgres_url(args.postgres_url) as url:
            await bench_backend("postgresql", url, args, measured)
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"postgresql skipped: {exc}")
    results = measured.accepts

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

    print(f"\nper run, {args.runs} runs in sequence: p50 (p99) ms of each store call")
    header = f"{'backend':<20} {'variant':<11}" + "".join(f" {s:>15}" for s in PATH_STEPS)
    print(header)
    print("-" * len(header))
    for path in measured.paths:
        cells = "".join(
            f" {f'{ms(path.steps[s], 50):.2f} ({ms(path.steps[s], 99):.2f})':>15}"
            for s in PATH_STEPS
        )
        print(f"{path.backend:<20} {path.variant:<11}{cells}")

    print(f"\nget_session while {args.acceptors} acceptors write: ms")
    header = f"{'backend':<20} {'variant':<11} {'reads':>7} {'p50':>8} {'p99':>8}"
    print(header)
    print("-" * len(header))
    for backend, variant, latencies in measured.reads:
        print(
            f"{backend:<20} {variant:<11} {len(latencies):>7}"
            f" {ms(latencies, 50):>8.2f} {ms(latencies, 99):>8.2f}"
        )

    print(f"\n{args.burst} runs ending at once, {args.bursts} times: ms")
    header = (
        f"{'backend':<20} {'variant':<11} {'call p50':>9} {'call p99':>9}"
        f" {'round p50':>10} {'round p99':>10}"
    )
    print(header)
    print("-" * len(header))
    for b in measured.bursts:
        print(
            f"{b.backend:<20} {b.variant:<11} {ms(b.latencies, 50):>9.2f}"
            f" {ms(b.latencies, 99):>9.2f} {ms(b.rounds, 50):>10.2f} {ms(b.rounds, 99):>10.2f}"
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
    parser.add_argument("--runs", type=int, default=200, help="plain runs in sequence")
    parser.add_argument("--burst", type=int, default=20, help="runs ending at once")
    parser.add_argument("--bursts", type=int, default=30, help="times the burst is measured")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))

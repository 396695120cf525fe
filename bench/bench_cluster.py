"""Replicas on one PostgreSQL (docs/replicas.md): throughput with 1, 2 and 3
replicas, failover after ``kill -9``, and a command accepted on one replica
acting on another.

Every replica is its own process (bench/cluster_replica.py: the service
``chatbridge run`` builds, with ``[cluster] enabled``, poll_s 0.2, lease_ttl_s
2 for failover and ``--ttl`` (10) elsewhere: on a loaded machine of 2 cores a
2 s lease is lost mid-run now and then, interrupting the run; and an
in-process Slack-named transport in place of Slack), the fake
claude answering at once (echoing its prompt). Each section runs on a fresh
PostgreSQL database, dropped at the end.

throughput: ``--messages`` messages over ``--rooms`` conversations, each
message handed to a replica chosen at random (as Slack spreads events over an
app's connections), so most land on a replica that does not own their
conversation and are forwarded; every replica accepts its share with
``--acceptors`` acceptors at once, all replicas together. One message per run
(``max_batch`` 1, no coalescing window), 4 runs at once per replica.
Printed: accepted messages/s (all messages over the time from the first
accept's start to the last one's end), accept latency p50/p99, runs started/s
(runs over the time from the first run's start to the last one's, as the
runs table records them), whether every message was answered, and how many
answers reached the transport twice.

failover: replica B and, per round, a new replica A. A takes a conversation
(a message, answered), is killed with SIGKILL, and at once B accepts a new
message in that conversation. Measured: from the kill to B's answer to it.
B first forwards it to A (A's lease is still live); once the lease expires,
B's poll takes the conversation, recovers it and runs the message.

command: replicas A and B; the fake claude waits (a run that goes on). Per
round A runs a message in a new conversation; once the run is recorded as
running, B accepts a message there (measured: from B's accept call to A's
dispatcher holding it), then ``!stop`` (measured: from B's accept call to A's
dispatcher being told to stop the run: the cancel starts there).

    python bench/bench_cluster.py [--only throughput|failover|command] ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).parents[1]))

from bridge.store.migrate import migrate
from tests.config_files import write_toml
from tests.fakes.fake_claude import install
from tests.store.conftest import (
    _asyncpg_dsn,
    create_database,
    drop_database,
    postgres_admin_url,
    unique_name,
    with_database,
)

HERE = Path(__file__).parent
GUARD_S = 180.0


@asynccontextmanager
async def database() -> AsyncIterator[str]:
    admin = postgres_admin_url()
    name = unique_name("bench_cluster")
    await create_database(admin, name)
    url = with_database(admin, name)
    try:
        await migrate(url)
        yield url
    finally:
        await drop_database(admin, name)


def config(
    home: Path,
    name: str,
    url: str,
    *,
    rooms: int,
    env: dict[str, str],
    bin_dir: Path,
    ttl: float,
) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    return write_toml(
        home / "chatbridge.toml",
        {
            "runner": {
                "claude_bin": str(bin_dir / "claude"),
                "stop_grace_s": 1.0,
                "state_dir": str(home / "state"),
                "max_concurrent_runs": 4,
            },
            "database": {"url": url},
            "console": {"enabled": False},
            "http": {"listen": ""},
            "slack": {"bot_token": "xoxb-bench", "app_token": "xapp-bench"},
            "rooms": [
                {"transport": "slack", "id": f"C{i}", "allowed_users": ["U1"]} for i in range(rooms)
            ],
            "cluster": {"enabled": True, "replica_id": name, "lease_ttl_s": ttl, "poll_s": 0.2},
            "dispatcher": {"coalesce_ms": 0, "max_wait_ms": 0, "max_batch": 1},
            "defaults": {"cwd": str(home), "env": env},
        },
    )


class Replica:
    """One replica process and what it reported."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name = name
        self.process = process
        self.events: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            self.events.append(json.loads(line))
            self.changed.set()
        self.changed.set()

    def send(self, cmd: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(cmd) + "\n").encode())

    async def wait_for(self, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        async with asyncio.timeout(GUARD_S):
            while True:
                for event in self.events:
                    if match(event):
                        return event
                if self.reader.done():
                    raise RuntimeError(f"replica {self.name} exited")
                self.changed.clear()
                await self.changed.wait()

    async def say(self, room: str, text: str) -> dict[str, Any]:
        said = len([e for e in self.events if e["op"] == "said"])
        self.send({"op": "say", "room": room, "text": text})
        await self.wait_for(lambda e: e["op"] == "said")
        async with asyncio.timeout(GUARD_S):
            while len([e for e in self.events if e["op"] == "said"]) <= said:
                self.changed.clear()
                await self.changed.wait()
        return [e for e in self.events if e["op"] == "said"][-1]

    def answers(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["op"] == "answer"]


@asynccontextmanager
async def replica(
    tmp: Path, name: str, url: str, rooms: int, env: dict[str, str], *, ttl: float = 2.0
) -> AsyncIterator[Replica]:
    home = tmp / name
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    install(bin_dir)
    path = config(home, name, url, rooms=rooms, env=env, bin_dir=bin_dir, ttl=ttl)
    log = (home / "replica.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / "cluster_replica.py"), str(path),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
        cwd=home,
    )  # fmt: skip
    r = Replica(name, process)
    try:
        await r.wait_for(lambda e: e["op"] == "ready")
        yield r
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        r.reader.cancel()
        log.close()


def pct(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def fetch(url: str, sql: str, *params: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(_asyncpg_dsn(url))
    try:
        return list(await conn.fetch(sql, *params))
    finally:
        await conn.close()


async def poll(check: Callable[[], Awaitable[bool]], every_s: float = 0.02) -> None:
    """Until ``check()``: for state nothing announces (a run's row, answers across
    processes), looked at every ``every_s``, failing after GUARD_S."""
    async with asyncio.timeout(GUARD_S):
        while not await check():  # noqa: ASYNC110 (nothing to wait on: the database)
            await asyncio.sleep(every_s)


def running(url: str, room: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        found = await fetch(
            url, "SELECT 1 FROM runs WHERE room_id = $1 AND status = 'running'", room
        )
        return bool(found)

    return check


# -- throughput --


async def throughput(args: argparse.Namespace, n: int) -> None:
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_NO_TOOL": "1"}
    rng = random.Random(n)
    with tempfile.TemporaryDirectory() as tmp:
        async with database() as url, AsyncExitStack() as stack:
            replicas = [
                await stack.enter_async_context(
                    replica(Path(tmp), f"r{i}", url, args.rooms, env, ttl=args.ttl)
                )
                for i in range(n)
            ]
            shares: list[list[list[str]]] = [[] for _ in replicas]
            for j in range(args.messages):
                shares[rng.randrange(n)].append([f"C{j % args.rooms}", f"m{j}"])
            for r, share in zip(replicas, shares, strict=True):
                r.send({"op": "burst", "msgs": share, "conc": args.acceptors})
            bursts = [await r.wait_for(lambda e: e["op"] == "burst") for r in replicas]
            start = min(b["start"] for b in bursts)
            end = max(b["end"] for b in bursts)
            lat = [x for b in bursts for x in b["lat"]]

            async def settled() -> bool:
                # Every message done or given up (a run interrupted by a lost lease
                # fails its message: it would be retried by hand, with !retry).
                left = await fetch(
                    url,
                    "SELECT (SELECT count(*) FROM messages WHERE state IN ('pending',"
                    " 'dispatched')) + (SELECT count(*) FROM runs WHERE status = 'running') AS n",
                )
                return int(left[0]["n"]) == 0

            await poll(settled, 0.2)
            lost = await fetch(url, "SELECT count(*) AS n FROM runs WHERE status = 'interrupted'")
            if lost[0]["n"]:
                print(f"  runs interrupted (a lease lost): {lost[0]['n']}", flush=True)
            texts = [a["text"] for r in replicas for a in r.answers()]
            once = sorted(set(texts)) == sorted(f"m{j}" for j in range(args.messages))
            twice = sorted(t for t, k in Counter(texts).items() if k > 1)
            if twice:
                print(f"  answered twice: {twice}", flush=True)
            rows = await fetch(
                url,
                "SELECT count(*) AS n, min(started_at) AS a, max(started_at) AS b,"
                " count(DISTINCT replica) AS reps FROM runs",
            )
            per = await fetch(url, "SELECT replica, count(*) AS n FROM runs GROUP BY replica")
            runs = rows[0]["n"]
            span = rows[0]["b"] - rows[0]["a"]
            spread = "/".join(str(p["n"]) for p in sorted(per, key=lambda p: p["replica"]))
            print(
                f"{n:>8} {args.messages / (end - start):>9.0f} {pct(lat, 50) * 1e3:>7.1f}"
                f" {pct(lat, 99) * 1e3:>7.1f} {runs:>6} {runs / span:>8.1f}"
                f" {spread:>12} {'yes' if once else 'NO':>8} {len(texts) - len(set(texts)):>6}",
                flush=True,
            )


# -- failover --


async def failover(args: argparse.Namespace) -> None:
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_NO_TOOL": "1"}
    times: list[float] = []
    forwarded_waits: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with database() as url, replica(Path(tmp), "b", url, args.rounds, env) as b:
            for i in range(args.rounds):
                room = f"C{i}"
                async with replica(Path(tmp), f"a{i}", url, args.rounds, env) as a:
                    await a.say(room, f"before {i}")  # A takes the conversation
                    before, after = f"before {i}", f"after {i}"
                    await a.wait_for(event("answer", text=before))
                    a.process.kill()
                    killed = time.monotonic()
                    await a.process.wait()
                    said = await b.say(room, after)
                    answer = await b.wait_for(event("answer", text=after))
                times.append(answer["t"] - killed)
                forwarded_waits.append(answer["t"] - said["t1"])
                print(f"  round {i}: kill -> answer {times[-1] * 1e3:.0f} ms", flush=True)
    print(
        f"failover, {args.rounds} rounds (lease_ttl_s 2, poll_s 0.2; bound 2 + 0.2 + 0.67 s):"
        f" p50 {pct(times, 50) * 1e3:.0f} ms, p99 {pct(times, 99) * 1e3:.0f} ms,"
        f" min {min(times) * 1e3:.0f} ms, max {max(times) * 1e3:.0f} ms"
    )


def event(op: str, **fields: str) -> Callable[[dict[str, Any]], bool]:
    """A replica's event of kind ``op`` carrying these fields."""

    def match(e: dict[str, Any]) -> bool:
        return e["op"] == op and all(e.get(k) == v for k, v in fields.items())

    return match


# -- a command across replicas --


async def command(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "FAKE_CLAUDE_ECHO": "1",
            "FAKE_CLAUDE_NO_TOOL": "1",
            "FAKE_CLAUDE_WAIT_FOR": str(Path(tmp) / "never"),
        }
        forward: list[float] = []
        stop: list[float] = []
        accept: list[float] = []
        async with (
            database() as url,
            replica(Path(tmp), "a", url, args.rounds, env, ttl=args.ttl) as a,
            replica(Path(tmp), "b", url, args.rounds, env, ttl=args.ttl) as b,
        ):
            for i in range(args.rounds):
                room = f"C{i}"
                await a.say(room, f"hold {i}")
                await poll(running(url, room))
                said = await b.say(room, f"more {i}")
                more = f"more {i}"
                held = await a.wait_for(event("submit", text=more))
                forward.append(held["t"] - said["t0"])
                accept.append(said["t1"] - said["t0"])
                said = await b.say(room, "!stop")
                stopped = await a.wait_for(event("stop", room=room))
                stop.append(stopped["t"] - said["t0"])
                accept.append(said["t1"] - said["t0"])
                check = running(url, room)

                async def ended(check: Callable[[], Awaitable[bool]] = check) -> bool:
                    return not await check()

                await poll(ended)
    for label, values in (
        ("B's accept call (record, find the owner, NOTIFY)", accept),
        ("message: B's accept -> A's dispatcher holds it", forward),
        ("!stop:   B's accept -> A's dispatcher stops the run", stop),
    ):
        print(
            f"  {label:<52} p50 {pct(values, 50) * 1e3:6.1f} ms  p99 {pct(values, 99) * 1e3:6.1f}"
            f" ms  max {max(values) * 1e3:6.1f} ms  (n={len(values)})"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["throughput", "failover", "command"])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--rooms", type=int, default=50)
    parser.add_argument("--acceptors", type=int, default=20)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rounds", type=int, default=10, help="failover rounds")
    parser.add_argument("--command-rounds", type=int, default=30)
    parser.add_argument(
        "--ttl",
        type=float,
        default=10.0,
        help="lease_ttl_s of the throughput and command sections (failover: 2)",
    )
    args = parser.parse_args()
    if args.only in (None, "throughput"):
        print(
            f"throughput: {args.messages} messages over {args.rooms} conversations,"
            f" {args.acceptors} acceptors per replica, 1 message per run, 4 runs per replica"
        )
        print(
            f"{'replicas':>8} {'msg/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'runs':>6}"
            f" {'runs/s':>8} {'per replica':>12} {'all done':>8} {'twice':>6}"
        )
        for n in args.replicas:
            await throughput(args, n)
    if args.only in (None, "failover"):
        await failover(args)
    if args.only in (None, "command"):
        args.rounds = args.command_rounds
        print(f"command across replicas, {args.rounds} rounds:")
        await command(args)


if __name__ == "__main__":
    asyncio.run(main())

"""A cluster under test: N ``chatbridge run`` replicas on a private PostgreSQL,
local-slack with many channels (one conversation each) and, in Events mode,
HAProxy in front of the replicas. Plus the load: messages posted as a person,
each text its own id, and what the bridge recorded of them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bridge.store.migrate import migrate
from tests.config_files import merged, write_toml
from tests.replicas import invariants
from tests.replicas.load_balancer import Backend, LoadBalancer, run_haproxy
from tests.replicas.postgres_server import PostgresServer
from tests.replicas.replicas import ReplicaProcess
from tests.service_process import base_config
from tests.transports.slack import peer
from tests.transports.slack.harness import require_local_slack

LOGS_ENV = "CHATBRIDGE_CLUSTER_TEST_LOGS"
"""A directory: each test's replica logs and run log are kept there."""
LEASE_TTL_S = 2.0
POLL_S = 0.3


def failover_s(lease_ttl_s: float = LEASE_TTL_S, poll_s: float = POLL_S) -> float:
    """docs/replicas.md: lease_ttl_s + poll_s, plus up to a renewal period."""
    return lease_ttl_s + poll_s + lease_ttl_s / 3


def channel(i: int) -> str:
    return f"C0R{i:02d}"


def workspace(mode: str, request_url: str | None, conversations: int) -> dict[str, Any]:
    config = peer.config(mode, request_url)
    members = [peer.ALICE, peer.BOT_USER]
    config["channels"] += [
        {"id": channel(i), "name": f"room-{i:02d}", "members": members}
        for i in range(conversations)
    ]
    return config


@dataclass
class Posted:
    text: str
    at: float
    """``time.time()`` just before it was posted."""


@dataclass
class SlackCluster:
    tmp: Path
    server: PostgresServer
    database: str
    slack: peer.LocalSlack
    replicas: dict[str, ReplicaProcess]
    run_log: Path
    conversations: int
    balancer: LoadBalancer | None = None
    posted: list[Posted] = field(default_factory=list)
    _numbers: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url(self.database)

    async def post(self, conversation: int) -> Posted:
        """One message to ``conversation``; returns once delivered (and acknowledged)."""
        room = channel(conversation)
        number = self._numbers.get(room, 0)
        self._numbers[room] = number + 1
        posted = Posted(invariants.message_text(room, number), time.time())
        self.posted.append(posted)
        await self.slack.post_message(peer.ALICE, posted.text, channel=room)
        return posted

    async def accepted(self) -> list[str]:
        """Texts of the messages the bridge recorded, from the database itself."""
        rows = await self._fetch("SELECT text FROM messages")
        return [str(r["text"]) for r in rows]

    async def unfinished(self) -> list[tuple[str, str]]:
        """Accepted messages not yet run to an end (pending or in a run)."""
        rows = await self._fetch(
            "SELECT text, state FROM messages WHERE state IN ('pending', 'dispatched')"
        )
        return [(str(r["text"]), str(r["state"])) for r in rows]

    async def running(self) -> int:
        rows = await self._fetch("SELECT count(*) AS n FROM runs WHERE status = 'running'")
        return int(rows[0]["n"])

    async def owners(self) -> dict[str, str]:
        """Conversation -> replica, for every unexpired lease (the database's clock)."""
        rows = await self._fetch(
            "SELECT room_id, owner FROM leases WHERE room_id <> ''"
            " AND expires_at > extract(epoch FROM clock_timestamp())"
        )
        return {str(r["room_id"]): str(r["owner"]) for r in rows}

    async def unanswered(self, verdict: invariants.Verdict) -> list[str]:
        """Messages whose run the bridge recorded as succeeded but whose answer is in no
        message of their channel; and those of a run recorded interrupted with no
        ``!retry`` notice in their channel (an interrupted run is reported, not answered)."""
        recorded = await self.runs_recorded([r.run for r in verdict.runs])
        answers: dict[str, str] = {}
        missing = []
        for run in verdict.runs:
            status = recorded.get(run.run, ("?", None))[0]
            for message in run.messages:
                room = invariants.conversation_of(message)
                if room not in answers:
                    bot = await self.slack.bot_messages(room)
                    answers[room] = "\n".join(str(m.get("text", "")) for m in bot)
                if status == "succeeded" and message not in answers[room]:
                    missing.append(message)
                elif status == "interrupted" and "!retry" not in answers[room]:
                    missing.append(f"{message} (interrupted, no !retry notice)")
        return missing

    async def deliveries(self) -> dict[str, str]:
        """Message text -> what local-slack got back when it delivered the event
        (``HTTP 200``, ``HTTP 500``, ``POST failed: ...``), from its log. The load posts
        one message at a time, so an event's outcome is the next outcome logged."""
        outcome: dict[str, str] = {}
        waiting: str | None = None
        for entry in await self.slack.log():
            if entry.get("kind") != "events_api":
                continue
            if entry.get("direction") == "to_bot":
                event = json.loads(entry.get("detail") or "{}").get("event", {})
                waiting = str(event.get("text", ""))
            elif waiting is not None:
                outcome[waiting] = str(entry.get("summary", ""))
                waiting = None
        return outcome

    async def runs_recorded(self, ids: list[str]) -> dict[str, tuple[str, str | None]]:
        """Run id -> (status, replica) as the database has them."""
        rows = await self._fetch("SELECT id, status, replica FROM runs")
        return {str(r["id"]): (str(r["status"]), r["replica"]) for r in rows if r["id"] in ids}

    async def sessions(self) -> list[str]:
        """The database's sessions of this test's database: state, what blocks them, the
        transaction's age and its last statement (why a replica waits)."""
        rows = await self._fetch(
            "SELECT pid, state, pg_blocking_pids(pid) AS blocked_by,"
            " round(extract(epoch FROM clock_timestamp() - xact_start)::numeric, 1) AS xact_s,"
            " left(query, 160) AS query FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [
            f"pid {r['pid']} {r['state']} blocked_by={list(r['blocked_by'])} xact={r['xact_s']}s"
            f" {r['query']!r}"
            for r in rows
            if r["state"] != "idle" or r["blocked_by"]
        ]

    async def _fetch(self, sql: str) -> list[asyncpg.Record]:
        dsn = self.url.replace("postgresql+asyncpg://", "postgresql://")
        conn = await asyncpg.connect(dsn)
        try:
            return list(await conn.fetch(sql))
        finally:
            await conn.close()

    async def settled(self, timeout: float = 40.0) -> None:
        """Until every accepted message has run (or was dropped) and no run is running."""
        last: object = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    with contextlib.suppress(OSError, asyncpg.PostgresError):
                        last = (await self.unfinished(), await self.running())
                        if last == ([], 0):
                            return
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(
                f"not settled in {timeout}s (unfinished, running): {last}\n{self.tails()}"
            ) from None

    def runs(self) -> list[invariants.Run]:
        return invariants.read_runs(self.run_log)

    def lines_about(self, needles: set[str], after: int = 6) -> str:
        """Every replica's log lines naming one of ``needles``, each with what follows
        it (a traceback)."""
        out = []
        for name, replica in self.replicas.items():
            for i, line in enumerate(replica.log):
                if any(n in line for n in needles if n and n != "None"):
                    out += [f"{name}: {x}" for x in replica.log[i : i + after]]
        return "\n".join(out)

    def tails(self, lines: int = 30) -> str:
        return "\n".join(f"=== {n}\n{r.tail(lines)}" for n, r in self.replicas.items())

    async def check(self) -> invariants.Verdict:
        """Nothing lost, nothing run twice, never two runs of a conversation at once."""
        accepted = await self.accepted()
        ours = [t for t in accepted if invariants.MESSAGE_ID.fullmatch(t)]
        runs = self.runs()
        rows = await self._fetch(
            "SELECT m.text, m.run_id FROM messages m JOIN runs r ON r.id = m.run_id"
            " WHERE r.status IN ('interrupted', 'failed')"
        )
        interrupted = [str(r["text"]) for r in rows]
        verdict = invariants.check(runs, ours, interrupted)
        # A run whose claude started but was stopped before it read its prompt did
        # start: its messages are the interrupted run's (reported with !retry).
        started = {r.run for r in runs}
        begun = {str(r["text"]) for r in rows if r["run_id"] in started}
        verdict.reported_unrun = [m for m in verdict.reported_unrun if m not in begun]
        if verdict.problems():
            rows = await self._fetch(
                "SELECT m.text, m.state, m.run_id, r.status, r.replica, r.pid"
                " FROM messages m LEFT JOIN runs r ON r.id = m.run_id"
            )
            suspects = set(verdict.lost) | set(verdict.twice)
            facts = [tuple(row) for row in rows if row["text"] in suspects]
            context = {"messages (text, state, run, its status, replica, pid)": repr(facts)}
            context |= {"their runs in the logs": self.lines_about({str(f[2]) for f in facts})}
            context |= {n: r.tail(30) for n, r in self.replicas.items()}
            return invariants.assert_invariants(runs, ours, context, interrupted)
        return verdict

    async def answered_texts(self, conversation: int) -> str:
        return "\n".join(
            str(m.get("text", "")) for m in await self.slack.bot_messages(channel(conversation))
        )


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback now (all bound at once, so no two equal)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


async def create_database(server: PostgresServer) -> str:
    name = f"cluster_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(server.dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    await migrate(server.url(name))
    return name


@contextlib.asynccontextmanager
async def slack_cluster(
    tmp: Path,
    server: PostgresServer,
    *,
    replicas: int = 3,
    conversations: int = 10,
    mode: str = "events",
    claude_env: dict[str, str] | None = None,
    cluster: dict[str, Any] | None = None,
    start: Iterable[str] | None = None,
) -> AsyncIterator[SlackCluster]:
    """Everything started (replicas named r1..rN, all of them unless ``start`` names
    some); everything stopped on exit, replicas by SIGTERM."""
    require_local_slack()
    database = await create_database(server)
    run_log = tmp / "runs.jsonl"
    names = [f"r{i + 1}" for i in range(replicas)]
    ports = free_ports(2 * replicas + 1)
    http_ports = {n: ports.pop() for n in names}
    events_ports = {n: ports.pop() for n in names} if mode == "events" else {}
    lb_port = ports.pop()
    request_url = f"http://127.0.0.1:{lb_port}/slack/events" if mode == "events" else None
    rooms_dir = tmp / "rooms"
    slack_home = tmp / "local-slack"
    slack_home.mkdir()
    async with peer.run_local_slack(
        slack_home, mode, None, workspace(mode, request_url, conversations)
    ) as slack:
        rooms = []
        for i in range(conversations):
            # Each conversation its own working directory: the fake claude's
            # overlap lock is per working directory.
            cwd = rooms_dir / channel(i)
            cwd.mkdir(parents=True)
            rooms.append(
                {
                    "transport": "slack",
                    "id": channel(i),
                    "reply_in_thread": True,
                    "allowed_users": [peer.ALICE],
                    "cwd": cwd,
                }
            )
        config = merged(
            base_config(tmp),
            {
                "database": {"url": server.url(database)},
                "cluster": {
                    "enabled": True,
                    "lease_ttl_s": LEASE_TTL_S,
                    "poll_s": POLL_S,
                    **(cluster or {}),
                },
                "dispatcher": {"coalesce_ms": 100},
                "slack": {"mode": mode, "api_url": slack.api_url},
                "rooms": rooms,
            },
        )

        def config_of(name: str) -> Path:
            """The shared configuration, plus the replica's own Events port."""
            if name not in events_ports:
                return write_toml(tmp / "chatbridge.toml", config)
            listen = {"slack": {"listen": f"127.0.0.1:{events_ports[name]}"}}
            return write_toml(tmp / f"chatbridge-{name}.toml", merged(config, listen))

        env = {
            "CHATBRIDGE_SLACK__BOT_TOKEN": peer.BOT_TOKEN,
            "CHATBRIDGE_SLACK__APP_TOKEN": peer.APP_TOKEN,
            "CHATBRIDGE_SLACK__SIGNING_SECRET": peer.SIGNING_SECRET,
            "FAKE_CLAUDE_ECHO": "1",
            "FAKE_CLAUDE_NO_TOOL": "1",
            "FAKE_CLAUDE_RUN_LOG": str(run_log),
            **(claude_env or {}),
        }
        procs = {
            n: ReplicaProcess(n, config_of(n), tmp / n, http_ports[n], events_ports.get(n), env)
            for n in names
        }
        the = SlackCluster(tmp, server, database, slack, procs, run_log, conversations)
        try:
            await asyncio.gather(*(procs[n].start() for n in (names if start is None else start)))
            if mode == "events":
                backends = [Backend(n, events_ports[n], http_ports[n]) for n in names]
                async with run_haproxy(tmp, lb_port, backends) as balancer:
                    the.balancer = balancer
                    await _all_up(the)
                    yield the
            else:
                yield the
        finally:
            results = await asyncio.gather(
                *(r.terminate() for r in procs.values()), return_exceptions=True
            )
            if keep := os.environ.get(LOGS_ENV):
                # For a post-mortem: every replica's whole log, and the run log.
                where = Path(keep) / tmp.name
                where.mkdir(parents=True, exist_ok=True)
                for name, replica in procs.items():
                    (where / f"{name}.log").write_text("\n".join(replica.log) + "\n")
                if run_log.exists():
                    (where / "runs.jsonl").write_text(run_log.read_text())
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]


async def _all_up(the: SlackCluster) -> None:
    """Until HAProxy's checks passed for every running replica: before, a post may
    find no server."""
    assert the.balancer is not None
    await the.balancer.wait_checked({n for n, r in the.replicas.items() if r.alive})

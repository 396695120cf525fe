"""Replicas and leases on PostgreSQL: who serves, and who owns which conversation.

Every time here is the database's clock (``clock_timestamp()``), never a
replica's: two replicas' clocks may disagree, the server's is one. The
statements are PostgreSQL's own (``ON CONFLICT``, ``FOR SHARE``,
``pg_notify``): replicas are refused on SQLite (bridge/config.py).

A lease's token grows by one whenever it is taken by a replica that did not
hold it unexpired: a write fenced with a token (:func:`check_fence`) fails
once anyone else has held the conversation since, or once the lease ran out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import Session

from bridge.core.model import RoomId, RoomKey, TransportName
from bridge.store.base import AuditAction, Fence, StoreError
from bridge.store.keys import THREAD_SEPARATOR, room_key, stored_id

log = logging.getLogger(__name__)

CHANNEL = "chatbridge"
"""The NOTIFY channel every replica listens on."""
LISTEN_CHECK_S = 5.0
"""How often the listening connection is checked."""
LISTEN_RETRY_S = 1.0
LOCK_TIMEOUT = "SET LOCAL lock_timeout = '2s'"


class ReplicaIdInUse(StoreError):
    """Another live replica is registered under this id."""


class ReplicaReplaced(StoreError):
    """This replica's row now belongs to a newer instance: this one must stop."""


@dataclass(frozen=True, slots=True)
class Lease:
    room: RoomKey
    """The conversation; a room id of ``""`` is its transport's leader lease."""
    owner: str
    token: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class Replica:
    id: str
    instance: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    runs: int
    """Its runs holding a run slot (a run waiting for a person lent its own)."""
    capacity: int
    draining: bool
    state_dir: str | None = None


@dataclass(frozen=True, slots=True)
class Renewal:
    """What one heartbeat found: the database's time and the leases still held."""

    now: float
    leases: list[Lease]


def leader_key(transport: str) -> RoomKey:
    """The lease of the one replica that connects ``transport`` (Matrix's sync)."""
    return RoomKey(TransportName(transport), RoomId(""))


def _lease(row: Any) -> Lease:
    return Lease(room_key(row.transport, row.room_id), row.owner, row.token, row.expires_at)


def check_fence(s: Session, room: RoomKey, fence: Fence) -> None:
    """Raise :class:`Fenced` unless ``fence`` still holds ``room``'s unexpired lease.

    Takes a share lock on the lease row: a replica taking the lease over waits
    for this transaction, so the write it fences commits before the takeover
    or not at all.
    """
    held = s.execute(
        text(
            "SELECT 1 FROM leases WHERE transport = :t AND room_id = :r AND owner = :o"
            " AND token = :k AND expires_at > extract(epoch from clock_timestamp()) FOR SHARE"
        ),
        {"t": room.transport, "r": stored_id(room), "o": fence.replica, "k": fence.token},
    )
    if held.first() is None:
        raise Fenced(f"{fence.replica} no longer holds {room} (token {fence.token})")
    if fence.cluster_cap is not None:
        # Starts are counted one at a time across the cluster: the lock is the
        # transaction's, so the count and this start commit together.
        s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CAP_LOCK})
        running = s.scalar(text("SELECT count(*) FROM runs WHERE status = 'running'"))
        if int(running or 0) >= fence.cluster_cap:
            raise ClusterFull(f"{running} runs of at most {fence.cluster_cap} are running")


class Fenced(StoreError):
    """The write depended on a lease its replica no longer holds."""


class ClusterFull(StoreError):
    """``[cluster] max_concurrent_runs`` runs are running: a start waits for one to end."""


CAP_LOCK = 0x63686174636170
"""Advisory lock serializing the cluster's run starts while a cluster cap is set."""


class Leases:
    """The replica registry and the leases, on the store's engine."""

    def __init__(self, engine: AsyncEngine, ttl_s: float) -> None:
        self._engine = engine
        self._ttl = ttl_s

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection]:
        """One transaction; driver errors become :class:`StoreError` (their first line)."""
        try:
            async with self._engine.begin() as conn:
                # A lease row locked by a paused replica's transaction must not hold
                # this up: the caller tries again at its next poll or renewal.
                await conn.execute(text(LOCK_TIMEOUT))
                yield conn
        except (SQLAlchemyError, OSError) as exc:
            raise StoreError(str(exc).splitlines()[0]) from exc

    async def _run(self, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
        async with self._transaction() as conn:
            return await self._in(conn, sql, params or {})

    async def _in(self, conn: AsyncConnection, sql: str, params: dict[str, Any]) -> list[Any]:
        result = await conn.execute(text(sql), params)
        return list(result.all()) if result.returns_rows else []

    async def register(self, me: Replica, *, alive: bool) -> None:
        """Record ``me`` as serving, replacing a previous instance of the same id.

        ``alive`` says whether the previous instance (its pid, if on this host)
        still runs; one on another host is alive while its heartbeat is
        recent. A live one makes this raise :class:`ReplicaIdInUse`.
        """
        async with self._transaction() as conn:
            rows = await self._in(
                conn,
                "SELECT host, pid,"
                " heartbeat_at > extract(epoch from clock_timestamp()) - :ttl AS fresh"
                " FROM replicas WHERE id = :id FOR UPDATE",
                {"id": me.id, "ttl": self._ttl},
            )
            if rows:
                other = rows[0]
                same_host = other.host == me.host
                if (same_host and alive and other.pid != me.pid) or (not same_host and other.fresh):
                    raise ReplicaIdInUse(
                        f"replica id {me.id!r} is in use by pid {other.pid} on {other.host}"
                        " (set [cluster] replica_id to a unique value)"
                    )
            await self._in(
                conn,
                "INSERT INTO replicas (id, instance, host, pid, started_at, heartbeat_at,"
                " runs, capacity, draining, state_dir) VALUES (:id, :inst, :host, :pid,"
                " extract(epoch from clock_timestamp()), extract(epoch from clock_timestamp()),"
                " 0, :cap, false, :dir) ON CONFLICT (id) DO UPDATE SET"
                " instance = excluded.instance, state_dir = excluded.state_dir,"
                " host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,"
                " heartbeat_at = excluded.heartbeat_at, runs = 0,"
                " capacity = excluded.capacity, draining = false",
                {
                    "id": me.id,
                    "inst": me.instance,
                    "host": me.host,
                    "pid": me.pid,
                    "cap": me.capacity,
                    "dir": me.state_dir,
                },
            )

    async def previous(self, replica_id: str) -> Replica | None:
        """The registered instance of ``replica_id`` (before :meth:`register` replaces it)."""
        rows = await self._run("SELECT * FROM replicas WHERE id = :id", {"id": replica_id})
        return _replica(rows[0]) if rows else None

    async def heartbeat(
        self,
        replica_id: str,
        instance: str,
        *,
        runs: int,
        capacity: int,
        draining: bool,
        held: Sequence[tuple[RoomKey, int]],
    ) -> Renewal:
        """Renew this replica's row and the unexpired leases of ``held`` (conversations
        and their tokens) it still owns, in one transaction.

        Only those: a lease the replica let go of in its memory (a recovery that
        failed, a deadline passed) must run out, so that a poll finds its work.
        Raises :class:`ReplicaReplaced` if a newer instance took the id.
        """
        async with self._transaction() as conn:
            mine = await self._in(
                conn,
                "UPDATE replicas SET heartbeat_at = extract(epoch from clock_timestamp()),"
                " runs = :runs,"
                " capacity = :cap, draining = :draining"
                " WHERE id = :id AND instance = :inst RETURNING heartbeat_at AS now",
                {
                    "id": replica_id,
                    "inst": instance,
                    "runs": runs,
                    "cap": capacity,
                    "draining": draining,
                },
            )
            if not mine:
                raise ReplicaReplaced(f"replica {replica_id!r} was taken by another instance")
            leases = await self._in(
                conn,
                "UPDATE leases AS l"
                " SET expires_at = extract(epoch from clock_timestamp()) + :ttl"
                " FROM unnest(CAST(:ts AS text[]), CAST(:rs AS text[]), CAST(:ks AS bigint[]))"
                " AS h(t, r, k)"
                " WHERE l.transport = h.t AND l.room_id = h.r AND l.token = h.k"
                " AND l.owner = :id AND l.expires_at > extract(epoch from clock_timestamp())"
                " RETURNING l.transport, l.room_id, l.owner, l.token, l.expires_at",
                {
                    "id": replica_id,
                    "ttl": self._ttl,
                    "ts": [room.transport for room, _ in held],
                    "rs": [stored_id(room) for room, _ in held],
                    "ks": [token for _, token in held],
                },
            )
        return Renewal(mine[0].now, [_lease(row) for row in leases])

    async def acquire(self, room: RoomKey, replica_id: str) -> Lease | None:
        """Take ``room``'s lease if nobody else holds it unexpired; None if someone does.

        Renews it if this replica holds it; a new token whenever it was not
        held unexpired by this replica (also by this replica before it ran out).
        """
        rows = await self._run(
            "INSERT INTO leases AS l (transport, room_id, owner, token, expires_at, acquired_at)"
            " VALUES (:t, :r, :me, 1, extract(epoch from clock_timestamp()) + :ttl,"
            " extract(epoch from clock_timestamp()))"
            " ON CONFLICT (transport, room_id) DO UPDATE SET owner = excluded.owner,"
            " token = CASE WHEN l.owner = excluded.owner AND l.expires_at > excluded.acquired_at"
            " THEN l.token ELSE l.token + 1 END,"
            " acquired_at = CASE WHEN l.owner = excluded.owner"
            " AND l.expires_at > excluded.acquired_at THEN l.acquired_at"
            " ELSE excluded.acquired_at END,"
            " expires_at = excluded.expires_at"
            " WHERE l.owner = excluded.owner OR l.expires_at <= excluded.acquired_at"
            " RETURNING transport, room_id, owner, token, expires_at",
            {"t": room.transport, "r": stored_id(room), "me": replica_id, "ttl": self._ttl},
        )
        return _lease(rows[0]) if rows else None

    async def release(self, rooms: Sequence[RoomKey], replica_id: str) -> None:
        """Let ``rooms`` go at once (expired now; the token stays: the next owner bumps it)."""
        for room in rooms:
            await self._run(
                "UPDATE leases SET expires_at = extract(epoch from clock_timestamp())"
                " WHERE transport = :t AND room_id = :r"
                " AND owner = :me",
                {"t": room.transport, "r": stored_id(room), "me": replica_id},
            )

    async def release_all(self, replica_id: str, instance: str) -> None:
        """Leave: every lease this replica holds expires now, and its row goes."""
        await self._run(
            "UPDATE leases SET expires_at = extract(epoch from clock_timestamp())"
            " WHERE owner = :me AND expires_at > extract(epoch from clock_timestamp())",
            {"me": replica_id},
        )
        await self._run(
            "DELETE FROM replicas WHERE id = :me AND instance = :inst",
            {"me": replica_id, "inst": instance},
        )

    async def lease(self, room: RoomKey) -> tuple[Lease, bool] | None:
        """``room``'s lease and whether it is unexpired; None if it never had one."""
        rows = await self._run(
            "SELECT *, expires_at > extract(epoch from clock_timestamp()) AS live FROM leases"
            " WHERE transport = :t AND room_id = :r",
            {"t": room.transport, "r": stored_id(room)},
        )
        return (_lease(rows[0]), bool(rows[0].live)) if rows else None

    async def leases(self) -> list[tuple[Lease, bool]]:
        """Every lease and whether it is unexpired, for ``chatbridge status``."""
        rows = await self._run(
            "SELECT *, expires_at > extract(epoch from clock_timestamp()) AS live FROM leases"
            " ORDER BY owner, transport, room_id"
        )
        return [(_lease(row), bool(row.live)) for row in rows]

    async def now(self) -> float:
        """The database's clock (every lease time is on it)."""
        rows = await self._run("SELECT extract(epoch from clock_timestamp())::float8 AS now")
        return float(rows[0].now)

    async def replicas(self) -> list[Replica]:
        rows = await self._run("SELECT * FROM replicas ORDER BY id")
        return [_replica(row) for row in rows]

    async def unowned_work(
        self, transports: Sequence[str], limit: int
    ) -> list[tuple[RoomKey, float]]:
        """Conversations of ``transports`` with work and no live owner, oldest work first.

        Work: a pending message, a pending outbox entry, a run still marked
        running (its replica died: the run is to be recovered), or a retry
        waiting for a usage limit to reset.
        """
        if not transports:
            return []
        rows = await self._run(
            "WITH work AS ("
            " SELECT transport, room_id, min(received_at) AS since FROM messages"
            "  WHERE state = 'pending' GROUP BY transport, room_id"
            " UNION ALL SELECT transport, room_id, min(created) FROM outbox"
            "  WHERE state = 'pending' GROUP BY transport, room_id"
            " UNION ALL SELECT transport, room_id, min(started_at) FROM runs"
            "  WHERE status = 'running' GROUP BY transport, room_id"
            " UNION ALL SELECT transport, room_id, min(resets_at) FROM limit_resumes"
            "  GROUP BY transport, room_id)"
            " SELECT w.transport, w.room_id, min(w.since) AS since FROM work w"
            " WHERE w.transport = ANY(:ts) AND NOT EXISTS (SELECT 1 FROM leases l"
            "  WHERE l.transport = w.transport AND l.room_id = w.room_id"
            "  AND l.expires_at > extract(epoch from clock_timestamp()))"
            " GROUP BY w.transport, w.room_id ORDER BY since LIMIT :n",
            {"ts": list(transports), "n": limit},
        )
        return [(room_key(row.transport, row.room_id), row.since) for row in rows]

    async def drop_unowned_threads(self, room: RoomKey, before: int, actor: str, at: float) -> int:
        """Drop the pending messages of ``room``'s thread conversations that no replica
        holds unexpired, accepted before message ``before``; one audit row each.
        Returns how many were dropped.

        A top-level ``!stop`` (docs/conversations.md): its replica stops the threads
        it runs and tells the others to stop theirs, but a thread message left in the
        inbox for want of a run slot (placement) is in no replica's hands. Those are
        dropped here, in one transaction that is the arbiter against a replica taking
        such a thread at the same moment: each thread's lease row (an expired one,
        owner ``""`` and token 0, if it never had one) is locked first, so a taking
        (:meth:`acquire`) either committed before (the lease is live: its owner
        heard the stop, the thread is left alone) or waits for this commit, and its
        recovery then reads the messages dropped.
        """
        prefix = room.room_id + THREAD_SEPARATOR
        params: dict[str, Any] = {"t": room.transport, "p": prefix, "n": len(prefix), "b": before}
        async with self._transaction() as conn:
            rows = await self._in(
                conn,
                "SELECT DISTINCT room_id FROM messages WHERE state = 'pending'"
                " AND transport = :t AND substr(room_id, 1, :n) = :p AND id < :b",
                params,
            )
            if not rows:
                return 0
            params["rs"] = sorted(row.room_id for row in rows)
            await self._in(
                conn,
                "INSERT INTO leases (transport, room_id, owner, token, expires_at, acquired_at)"
                " SELECT :t, r, '', 0, extract(epoch from clock_timestamp()),"
                " extract(epoch from clock_timestamp())"
                " FROM unnest(CAST(:rs AS varchar[])) AS r"
                " ON CONFLICT (transport, room_id) DO NOTHING",
                params,
            )
            # In one order (deadlocks), and re-read once a concurrent taking commits.
            free = await self._in(
                conn,
                "SELECT room_id FROM leases WHERE transport = :t AND room_id = ANY(:rs)"
                " AND expires_at <= extract(epoch from clock_timestamp())"
                " ORDER BY room_id FOR UPDATE",
                params,
            )
            if not free:
                return 0
            params["free"] = [row.room_id for row in free]
            dropped = await self._in(
                conn,
                "UPDATE messages SET state = 'dropped' WHERE state = 'pending'"
                " AND transport = :t AND room_id = ANY(:free) AND id < :b"
                " RETURNING id, room_id, run_id",
                params,
            )
            if dropped:
                await conn.execute(
                    text(
                        "INSERT INTO audit (at, action, transport, room_id, actor, message_id,"
                        " run_id, detail) VALUES (:at, :a, :t, :r, :actor, :m, :run, '')"
                    ),
                    [
                        {
                            "at": at,
                            "a": AuditAction.MESSAGE_DROPPED.value,
                            "t": room.transport,
                            "r": row.room_id,
                            "actor": actor,
                            "m": row.id,
                            "run": row.run_id,
                        }
                        for row in dropped
                    ],
                )
            return len(dropped)

    async def cluster_runs(self) -> int:
        """Runs marked running across the cluster (the cluster cap counts these)."""
        rows = await self._run("SELECT count(*) AS n FROM runs WHERE status = 'running'")
        return int(rows[0].n)

    async def listen(self, heard: Callable[[str], None]) -> None:
        """Hand every notification on :data:`CHANNEL` to ``heard``, until cancelled.

        On a connection of its own, checked every few seconds (a dead socket is
        otherwise noticed only when used); lost, it is opened again. What is
        sent while it is down is not heard: the replicas' polling covers that.
        """
        while True:
            try:
                await self._listen_once(heard)
            except Exception as exc:  # any driver error: the listener must come back
                log.warning("cluster notifications lost (%s); listening again", exc)
            await asyncio.sleep(LISTEN_RETRY_S)

    async def _listen_once(self, heard: Callable[[str], None]) -> None:
        """Listen on one connection until it is lost."""
        async with self._engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            lost = asyncio.Event()

            def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
                heard(payload)

            await driver.add_listener(CHANNEL, on_notify)
            driver.add_termination_listener(lambda _conn: lost.set())
            try:
                while not lost.is_set():
                    try:
                        async with asyncio.timeout(LISTEN_CHECK_S):
                            await lost.wait()
                    except TimeoutError:
                        async with asyncio.timeout(LISTEN_CHECK_S):
                            await driver.execute("SELECT 1")
            finally:
                # Never back into the pool still listening: a later listener would
                # hear every notice twice.
                await conn.invalidate()

    async def notify(self, payload: str) -> None:
        await self._run("SELECT pg_notify(:c, :p)", {"c": CHANNEL, "p": payload})


def _replica(row: Any) -> Replica:
    return Replica(
        row.id,
        row.instance,
        row.host,
        row.pid,
        row.started_at,
        row.heartbeat_at,
        row.runs,
        row.capacity,
        row.draining,
        row.state_dir,
    )


__all__ = [
    "CHANNEL",
    "Fenced",
    "Lease",
    "Leases",
    "Renewal",
    "Replica",
    "ReplicaIdInUse",
    "ReplicaReplaced",
    "check_fence",
    "leader_key",
]

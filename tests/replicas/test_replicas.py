"""Two replicas on one PostgreSQL: who runs a conversation, forwarding, commands,
fencing and failover (docs/replicas.md). The process-level suite (kill -9, SIGSTOP,
PostgreSQL restarts, a load balancer) is in tests/replicas."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import pytest

from bridge.core.model import MessageId, ReplyKind, RoomKey
from bridge.store.base import AuditAction, AuditFilter, Fence
from bridge.store.cluster import Fenced, Leases
from tests.replicas.conftest import ROOM, replica, replica_settings, until
from tests.replicas.replicas import results
from tests.store.conftest import _asyncpg_dsn

GUARD_S = 30.0


async def runs_of(url: str) -> list[tuple[str, str, str | None]]:
    conn = await asyncpg.connect(_asyncpg_dsn(url))
    try:
        rows = await conn.fetch("SELECT id, status, replica FROM runs ORDER BY seq")
    finally:
        await conn.close()
    return [(r["id"], r["status"], r["replica"]) for r in rows]


async def until_a_statement_waits_on_a_lock(url: str) -> None:
    """Returns once a statement of the test's database waits on a lock (pg_stat_activity)."""
    conn = await asyncpg.connect(_asyncpg_dsn(url))
    waiting = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    try:
        async with asyncio.timeout(GUARD_S):
            while not await conn.fetchval(waiting):
                await asyncio.sleep(0.01)
    finally:
        await conn.close()


async def test_the_owner_runs_what_any_replica_accepts(tmp_path: Path, cluster_db: str) -> None:
    async with (
        replica(replica_settings(tmp_path, "a", cluster_db)) as a,
        replica(replica_settings(tmp_path, "b", cluster_db)) as b,
    ):
        await a.chat.say("first")
        await a.chat.wait_until(lambda: results(a) == ["first"])
        # Accepted by b, for a's conversation: a runs it and answers.
        await b.chat.say("second")
        await a.chat.wait_until(lambda: results(a) == ["first", "second"])
        assert results(b) == []
        assert a.service.parts.cluster is not None
        assert a.service.parts.cluster.holds(ROOM)
    recorded = await runs_of(cluster_db)
    assert [(status, rep) for _, status, rep in recorded] == [("succeeded", "a")] * 2


async def test_a_stop_accepted_elsewhere_stops_the_owners_run(
    tmp_path: Path, cluster_db: str
) -> None:
    gate = tmp_path / "gate"
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_WAIT_FOR": str(gate)}
    async with (
        replica(replica_settings(tmp_path, "a", cluster_db, env=env)) as a,
        replica(replica_settings(tmp_path, "b", cluster_db, env=env)) as b,
    ):
        await a.chat.say("a long one")
        await until(lambda: a.service.parts.dispatcher.active_runs == 1)
        await b.chat.say("!stop")
        async with asyncio.timeout(GUARD_S):
            await a.service.parts.dispatcher.wait_idle()
        # The command's answer comes from the replica that carried it out.
        await a.chat.wait_until(lambda: len(a.chat.texts(ReplyKind.NOTICE)) >= 1)
        assert b.chat.texts() == []
    [(_, status, rep)] = await runs_of(cluster_db)
    assert (status, rep) == ("stopped", "a")


async def test_a_dead_replicas_conversation_is_taken_over_and_its_messages_run_once(
    tmp_path: Path, cluster_db: str
) -> None:
    async with replica(replica_settings(tmp_path, "b", cluster_db)) as b:
        async with replica(replica_settings(tmp_path, "a", cluster_db)) as a:
            await a.chat.say("before")
            await a.chat.wait_until(lambda: results(a) == ["before"])
            a.die()
            await asyncio.wait({a.task})
        # a's lease is still there: b forwards to a dead replica; the message
        # waits in the inbox until the lease runs out, then b takes it over.
        await b.chat.say("after")
        # (b may deliver a's last answer again: a died before recording its delivery.)
        await b.chat.wait_until(lambda: "after" in results(b))
        assert results(b).count("after") == 1
        assert b.service.parts.cluster is not None
        assert b.service.parts.cluster.holds(ROOM)
    recorded = await runs_of(cluster_db)
    assert [(status, rep) for _, status, rep in recorded] == [
        ("succeeded", "a"),
        ("succeeded", "b"),
    ]


async def test_a_start_fenced_by_a_lost_lease_records_nothing(cluster_db: str) -> None:
    from bridge.core.model import Batch, ExternalMessageId, InboundMessage, RunId, UserId
    from bridge.store.sql import SqlStore

    store = await SqlStore.open(cluster_db)
    try:
        leases = Leases(store.engine, ttl_s=1.0)
        lease = await leases.acquire(ROOM, "a")
        assert lease is not None
        assert lease.token == 1
        assert await leases.acquire(ROOM, "b") is None  # held, unexpired
        msg = await store.accept(
            InboundMessage(ROOM, UserId("U1"), "hi", ExternalMessageId("m1")), time.time()
        )
        assert msg is not None
        # The lease runs out (the database's clock), b takes it with a new token.
        await asyncio.sleep(1.1)
        taken = await leases.acquire(ROOM, "b")
        assert taken is not None
        assert taken.token == 2
        assert taken.owner == "b"
        with pytest.raises(Fenced):
            await store.start_run(RunId("r-a"), Batch(ROOM, (msg,)), time.time(), Fence("a", 1))
        assert await store.pending_messages(ROOM) == [msg]
        await store.start_run(RunId("r-b"), Batch(ROOM, (msg,)), time.time(), Fence("b", 2))
        assert (await store.get_run(RunId("r-b"))) is not None
    finally:
        await store.close()


async def test_a_top_level_stop_drops_only_what_waits_in_unowned_threads(
    cluster_db: str,
) -> None:
    """Leases.drop_unowned_threads: pending messages of the room's threads that no
    live lease covers, accepted before the stop; a thread taken at the same moment is
    the taker's (its lease row's lock orders the two)."""
    from sqlalchemy import text

    from bridge.core.model import (
        ExternalMessageId,
        InboundMessage,
        MessageState,
        RoomId,
        UserId,
    )
    from bridge.store.sql import SqlStore

    store = await SqlStore.open(cluster_db)
    try:
        leases = Leases(store.engine, ttl_s=30.0)
        ran_out = Leases(store.engine, ttl_s=0.0)
        other_room = ROOM.__class__(ROOM.transport, RoomId("C2"))

        async def say(room: RoomKey, ext: str) -> MessageId:
            msg = await store.accept(
                InboundMessage(room, UserId("U1"), ext, ExternalMessageId(ext)), time.time()
            )
            assert msg is not None
            return msg.id

        assert await leases.acquire(ROOM.in_thread("t1"), "b") is not None
        assert await ran_out.acquire(ROOM.in_thread("t3"), "c") is not None
        owned = await say(ROOM.in_thread("t1"), "owned")
        unowned = await say(ROOM.in_thread("t2"), "unowned")
        expired = await say(ROOM.in_thread("t3"), "expired")
        top = await say(ROOM, "top")
        elsewhere = await say(other_room.in_thread("t2"), "elsewhere")
        taken = await say(ROOM.in_thread("t4"), "taken")
        stop = await say(ROOM.in_thread("stop"), "stop")
        later = await say(ROOM.in_thread("t2"), "after the stop")

        # A replica takes t4 at this very moment: its acquisition is not committed yet.
        async with store.engine.connect() as conn:
            await conn.begin()
            await conn.execute(
                text(
                    "INSERT INTO leases (transport, room_id, owner, token, expires_at,"
                    " acquired_at) VALUES ('slack', 'C1/t4', 'd', 1,"
                    " extract(epoch from clock_timestamp()) + 30,"
                    " extract(epoch from clock_timestamp()))"
                )
            )
            dropping = asyncio.create_task(
                leases.drop_unowned_threads(ROOM, stop, "U1", time.time())
            )
            # It waits for the taking: once its statement waits on the row lock, it
            # cannot finish before the commit below.
            await until_a_statement_waits_on_a_lock(cluster_db)
            assert not dropping.done()
            await conn.commit()
        assert await dropping == 2
        states = await store.message_states([owned, unowned, expired, top, elsewhere, taken, later])
        dropped = [i for i, state in states.items() if state is MessageState.DROPPED]
        assert sorted(dropped) == sorted([unowned, expired])
        audited = await store.audit_trail(AuditFilter(message_id=unowned))
        assert [(r.action, r.actor) for r in audited][-1] == (AuditAction.MESSAGE_DROPPED, "U1")
        # A thread that never had a lease is taken as before (token 1).
        lease = await leases.acquire(ROOM.in_thread("t2"), "a")
        assert lease is not None
        assert lease.token == 1
    finally:
        await store.close()


async def test_status_prints_the_replicas_and_who_owns_what(
    tmp_path: Path, cluster_db: str
) -> None:
    from bridge.cluster.status_report import status_text

    settings = replica_settings(tmp_path, "a", cluster_db)
    async with replica(settings) as a, replica(replica_settings(tmp_path, "b", cluster_db)):
        await a.chat.say("hello")
        await a.chat.wait_until(lambda: results(a) == ["hello"])
        text = await status_text(settings)
    lines = text.splitlines()
    assert lines[0] == "replicas: 2"
    assert [line.split()[:2] for line in lines[1:3]] == [["a", "live"], ["b", "live"]]
    assert lines[3] == "leases: 1 live, 0 expired"
    assert lines[4].split()[:3] == ["slack:C1", "owner", "a"]
    assert "runs: 0 running" in lines
    assert lines[-1] == "inbox: 0 pending"


async def test_the_cluster_cap_counts_every_replicas_runs(cluster_db: str) -> None:
    from bridge.core.model import Batch, ExternalMessageId, InboundMessage, RoomId, RunId, UserId
    from bridge.store.cluster import ClusterFull
    from bridge.store.sql import SqlStore

    other = ROOM.__class__(ROOM.transport, RoomId("C2"))
    store = await SqlStore.open(cluster_db)
    try:
        leases = Leases(store.engine, ttl_s=30.0)
        a = await leases.acquire(ROOM, "a")
        b = await leases.acquire(other, "b")
        assert a is not None
        assert b is not None
        one = await store.accept(
            InboundMessage(ROOM, UserId("U1"), "1", ExternalMessageId("m1")), time.time()
        )
        two = await store.accept(
            InboundMessage(other, UserId("U1"), "2", ExternalMessageId("m2")), time.time()
        )
        assert one is not None
        assert two is not None
        await store.start_run(RunId("r1"), Batch(ROOM, (one,)), time.time(), Fence("a", 1, 1))
        # b's run would be the cluster's second: refused, and nothing recorded.
        with pytest.raises(ClusterFull):
            await store.start_run(RunId("r2"), Batch(other, (two,)), time.time(), Fence("b", 1, 1))
        assert await store.pending_messages(other) == [two]
        # Without the cap (or with room for it) it starts.
        await store.start_run(RunId("r2"), Batch(other, (two,)), time.time(), Fence("b", 1, 2))
    finally:
        await store.close()


async def test_a_replica_stopping_hands_its_idle_conversations_over_at_once(
    tmp_path: Path, cluster_db: str
) -> None:
    # Leases far longer than the test's guard: only a hand-over lets b answer.
    slow = {"cluster": {"lease_ttl_s": 600}}
    async with replica(replica_settings(tmp_path, "b", cluster_db, slow)) as b:
        async with replica(replica_settings(tmp_path, "a", cluster_db, slow)) as a:
            await a.chat.say("on a")
            await a.chat.wait_until(lambda: results(a) == ["on a"])
        # a has stopped (SIGTERM's path): its conversation is free at once.
        await b.chat.say("on b")
        await b.chat.wait_until(lambda: "on b" in results(b))
        assert b.service.parts.cluster is not None
        assert b.service.parts.cluster.holds(ROOM)
    recorded = await runs_of(cluster_db)
    assert [(status, rep) for _, status, rep in recorded] == [
        ("succeeded", "a"),
        ("succeeded", "b"),
    ]
    conn = await asyncpg.connect(_asyncpg_dsn(cluster_db))
    try:
        replicas = await conn.fetch("SELECT id FROM replicas ORDER BY id")
    finally:
        await conn.close()
    assert [r["id"] for r in replicas] == []  # both left the registry


async def test_matrix_is_connected_by_one_replica_and_the_next_takes_over(
    tmp_path: Path, cluster_db: str
) -> None:
    from bridge.core.model import RoomId, RoomKey, TransportName
    from tests.bridge.chat_room import ChatRoom

    room = RoomKey(TransportName("matrix"), RoomId("!r:example.org"))

    class MatrixRoom(ChatRoom):
        name = TransportName("matrix")
        connected_runs = 0

        async def run(self, sink, ready):  # type: ignore[no-untyped-def]
            MatrixRoom.connected_runs += 1
            self.sink = sink
            self.changed.set()  # connected: the test waits for this
            await super().run(sink, ready)

    config = {
        "matrix": {
            "homeserver": "http://127.0.0.1:9",
            "user_id": "@bot:example.org",
            "access_token": "t",
        },
        "rooms": [{"transport": "matrix", "id": room.room_id, "allowed_users": ["U1"]}],
    }

    def chat(name: str) -> ChatRoom:
        return MatrixRoom(room, "U1", id_prefix=f"{name}-in")

    async with replica(replica_settings(tmp_path, "a", cluster_db, config), chat("a")) as a:
        # a leads: it connected Matrix, and it runs the Matrix conversation.
        await a.chat.wait_until(lambda: a.chat.sink is not None)
        async with replica(replica_settings(tmp_path, "b", cluster_db, config), chat("b")) as b:
            assert b.service.ready.is_set()  # ready as a follower, not connected
            assert b.chat.sink is None
            await a.chat.say("to the leader")
            await a.chat.wait_until(lambda: results(a) == ["to the leader"])
            a.die()
            await asyncio.wait({a.task})
            # The leader lease runs out; b connects and takes the conversation.
            await b.chat.wait_until(lambda: b.chat.sink is not None)
            await b.chat.say("to the new leader")
            await b.chat.wait_until(lambda: "to the new leader" in results(b))
            assert b.service.parts.cluster is not None
            assert b.service.parts.cluster.leads("matrix")
    assert MatrixRoom.connected_runs == 2
    recorded = await runs_of(cluster_db)
    assert [(status, rep) for _, status, rep in recorded] == [
        ("succeeded", "a"),
        ("succeeded", "b"),
    ]


async def test_an_edit_or_deletion_received_elsewhere_reaches_the_owners_queue(
    tmp_path: Path, cluster_db: str
) -> None:
    gate = tmp_path / "gate"
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_WAIT_FOR": str(gate)}
    async with (
        replica(replica_settings(tmp_path, "a", cluster_db, env=env)) as a,
        replica(replica_settings(tmp_path, "b", cluster_db, env=env)) as b,
    ):
        await a.chat.say("first")
        await until(lambda: a.service.parts.dispatcher.active_runs == 1)
        # Queued on a behind its run, accepted (and then changed) on b.
        kept, _ = await b.chat.say("typo")
        gone, _ = await b.chat.say("never mind")
        await until(lambda: a.service.parts.dispatcher.status(ROOM).waiting == 2)
        await b.chat.edited(kept, "fixed")
        await b.chat.deleted(gone)
        await until(lambda: a.service.parts.dispatcher.status(ROOM).waiting == 1)
        gate.touch()
        await a.chat.wait_until(lambda: results(a) == ["first", "fixed"])
    assert results(b) == []


async def test_a_top_level_stop_in_a_thread_room_stops_every_replicas_threads(
    tmp_path: Path, cluster_db: str
) -> None:
    gate = tmp_path / "gate"
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_WAIT_FOR": str(gate)}
    threads = {"defaults": {"conversation": "thread"}}
    async with (
        replica(replica_settings(tmp_path, "a", cluster_db, threads, env=env)) as a,
        replica(replica_settings(tmp_path, "b", cluster_db, threads, env=env)) as b,
    ):
        await a.chat.say("on a", thread="t1")
        await b.chat.say("on b", thread="t2")
        await until(lambda: a.service.parts.dispatcher.active_runs == 1)
        await until(lambda: b.service.parts.dispatcher.active_runs == 1)
        await a.chat.say("!status")

        def notices() -> list[str]:
            return a.chat.texts(ReplyKind.NOTICE) + b.chat.texts(ReplyKind.NOTICE)

        # Recorded by a, the top-level conversation is free: b's poll may take it (and
        # answer) before a places it; the room sees one answer either way.
        await until(lambda: len(notices()) >= 1)
        [status] = notices()
        if a.chat.texts(ReplyKind.NOTICE):
            assert "t1" in status
            assert "Thread t2: on replica b." in status
        else:
            assert "t2" in status
            assert "Thread t1: on replica a." in status
        await a.chat.say("!stop")
        await until(lambda: a.service.parts.dispatcher.active_runs == 0)
        await until(lambda: b.service.parts.dispatcher.active_runs == 0)
    recorded = await runs_of(cluster_db)
    assert sorted((status, rep) for _, status, rep in recorded) == [
        ("stopped", "a"),
        ("stopped", "b"),
    ]


async def test_an_idle_conversation_is_let_go(tmp_path: Path, cluster_db: str) -> None:
    from bridge.cluster.status_report import status_text

    settings = replica_settings(tmp_path, "a", cluster_db, {"cluster": {"lease_ttl_s": 1}})
    async with replica(settings) as a:
        cluster = a.service.parts.cluster
        assert cluster is not None
        cluster.idle_release_min_s = 0.0  # (the floor is four lease lifetimes: 4 s)
        await a.chat.say("hello")
        await a.chat.wait_until(lambda: results(a) == ["hello"])
        assert cluster.holds(ROOM)
        await until(lambda: not cluster.holds(ROOM))
        # Let go in memory first, then in the database (never held twice).
        async with asyncio.timeout(30):
            while "leases: 0 live, 1 expired" not in (await status_text(settings)).splitlines():
                await asyncio.sleep(0.05)
        # Taken again by the next message, as any free conversation.
        await a.chat.say("again")
        await a.chat.wait_until(lambda: results(a) == ["hello", "again"])


async def test_a_conversation_let_go_stops_the_claude_kept_warm_for_it(
    tmp_path: Path, cluster_db: str
) -> None:
    # The next owner resumes the session: a claude kept warm here must not outlive
    # the lease (two claudes of one session).
    # (The idle timer that lets a conversation go is test_an_idle_conversation_is_let_go's:
    # here the lease is kept long, so a loaded machine cannot lose it during the run.)
    config = {"runner": {"prestart": True, "prestart_keep_s": 600}}
    async with replica(replica_settings(tmp_path, "a", cluster_db, config)) as a:
        cluster, prestarts = a.service.parts.cluster, a.service.parts.executor.prestarts
        assert cluster is not None
        assert prestarts is not None
        await a.chat.say("hello")
        await a.chat.wait_until(lambda: results(a) == ["hello"])
        await until(lambda: ROOM in prestarts._warm)  # kept warm after the run
        await cluster.release_idle([ROOM], tell=False)  # as the idle timer lets it go
        assert not cluster.holds(ROOM)
        released = a.service.parts.metrics.prestarts.labels("wasted", "released")
        assert released._value.get() == 1
        assert prestarts.take(ROOM) is None

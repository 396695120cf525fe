"""Review of the late replica changes (698002d, 38dd0e4, e8ac713, e383d9a, aaa9264,
c8973d8, aef3243): defects found by trying to break them, each a test that fails on
the code it was written against (docs/replicas.md)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    Message,
    ReplyKind,
    RunId,
    UserId,
)
from bridge.store.base import Fence, RunEnding, StoreError
from bridge.store.cluster import Leases, Replica
from bridge.store.sql import SqlStore
from tests.replicas.conftest import (
    ROOM,
    SlackRoom,
    held_room_stops,
    replica,
    replica_settings,
    until,
)
from tests.store.conftest import _asyncpg_dsn

# Everything below is answered within a lease's lifetime and a few polls
# (lease_ttl_s = 4, poll_s = 0.2) when it works; the guard only bounds a failure.
ANSWERED_S = 15.0


def results(chat: Any) -> list[str]:
    return list(chat.texts(ReplyKind.RESULT))


async def runs_of(url: str) -> list[tuple[str, str, str | None]]:
    conn = await asyncpg.connect(_asyncpg_dsn(url))
    try:
        rows = await conn.fetch("SELECT id, status, replica FROM runs ORDER BY seq")
    finally:
        await conn.close()
    return [(r["id"], r["status"], r["replica"]) for r in rows]


async def test_a_stop_pending_at_a_takeover_does_not_drop_the_message_sent_after_it(
    tmp_path: Path, cluster_db: str
) -> None:
    """The owner z of a conversation dies; b accepts `!stop`, then "after the stop",
    and forwards both to z, who never hears them. b takes the conversation over when
    z's lease runs out. Its recovery (keep_commands) queues "after the stop" at once
    but leaves the `!stop` pending for the poll's recheck, which carries it out
    afterwards: the stop, sent first, drops (or stops) the message sent after it,
    which is never answered."""
    async with replica(replica_settings(tmp_path, "b", cluster_db)) as b:
        cluster = b.service.parts.cluster
        assert cluster is not None
        # Replica z owned the conversation and died: its lease runs for lease_ttl_s.
        assert await cluster.leases.acquire(ROOM, "z") is not None
        await b.chat.say("!stop")
        await b.chat.say("after the stop")
        await until(lambda: cluster.holds(ROOM), ANSWERED_S)
        await until(lambda: results(b.chat) == ["after the stop"], ANSWERED_S)


async def test_a_replica_restarted_after_its_run_was_taken_over_does_not_kill_it(
    tmp_path: Path, cluster_db: str
) -> None:
    """38dd0e4: a replica taking over on the same host follows a dead replica's run
    (its answer comes from the journal). a leaves its run to its supervisor and
    goes; b takes the conversation over and follows the run. a then comes back with
    its id (its supervisor restarts it): its start stops "its own runs in
    conversations it no longer holds" (the run still names a) and reports the run
    interrupted, though b follows it: the answer of a run that went on well is lost."""
    gate = tmp_path / "gate"
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_WAIT_FOR": str(gate)}
    detach = {"runner": {"on_shutdown": "detach"}}
    a_settings = replica_settings(tmp_path, "a", cluster_db, detach, env=env)
    async with replica(replica_settings(tmp_path, "b", cluster_db, env=env)) as b:
        async with replica(a_settings) as a:
            await a.chat.say("a long one")
            async with asyncio.timeout(ANSWERED_S):
                while not await a.service.store.live_runs():  # registered: detachable
                    await asyncio.sleep(0.01)
        # a is gone, its run goes on; its lease runs out and b follows the run.
        cluster = b.service.parts.cluster
        assert cluster is not None
        await until(lambda: cluster.holds(ROOM), ANSWERED_S)
        await until(lambda: b.service.parts.dispatcher.active_runs == 1, ANSWERED_S)
        again = SlackRoom(ROOM, "U1", id_prefix="a-again")
        async with replica(a_settings, again):
            gate.touch()
            await until(lambda: results(b.chat) == ["a long one"], ANSWERED_S)
    [(_, status, _)] = await runs_of(cluster_db)
    assert status == "succeeded"


async def test_a_top_level_stop_drops_a_thread_message_waiting_for_a_free_slot(
    tmp_path: Path, cluster_db: str
) -> None:
    """docs/conversations.md: at the top level `!stop` stops all of a room's threads,
    "runs and waiting messages". With replicas, a message for a thread nobody owns
    that comes while every run slot is busy is left in the inbox for a replica with
    a free slot (placement), in no replica's queue. The top-level `!stop` (c8973d8)
    stops the threads replicas run, and this one survives it: once the stop frees
    the slot, the poll takes the thread and runs the message sent before the stop."""
    gate = tmp_path / "gate"
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_WAIT_FOR": str(gate)}
    config = {"defaults": {"conversation": "thread"}, "runner": {"max_concurrent_runs": 1}}
    async with replica(replica_settings(tmp_path, "a", cluster_db, config, env=env)) as a:
        await a.chat.say("busy", thread="t1")
        await until(lambda: a.service.parts.dispatcher.active_runs == 1, ANSWERED_S)
        await a.chat.say("waiting for a slot", thread="t2")  # the only slot is busy
        await a.chat.say("!stop")
        await until(lambda: a.service.parts.dispatcher.active_runs == 0, ANSWERED_S)
        gate.touch()
        # A later message of the same thread runs only after anything still waiting
        # there (with it in one batch, or after it): once its answer is in, the
        # dropped message would have been answered too.
        await a.chat.say("probe", thread="t2")
        await until(lambda: any("probe" in text for text in results(a.chat)), ANSWERED_S)
        assert not any("waiting for a slot" in text for text in results(a.chat))
    conn = await asyncpg.connect(_asyncpg_dsn(cluster_db))
    try:
        rows = await conn.fetch("SELECT state FROM messages WHERE text = 'waiting for a slot'")
    finally:
        await conn.close()
    assert [r["state"] for r in rows] == ["dropped"]


async def test_a_run_that_never_began_keeps_its_messages_when_a_write_fails(
    tmp_path: Path, cluster_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """698002d: a run whose start was recorded but that never began (its replica z died
    before making the run's directory) is ended as interrupted, then its messages are
    queued again: two writes (finish_run, then requeue_run). The database failing the
    second (briefly away, as e383d9a expects of it) fails the takeover, which is
    retried; but the run is no longer running, its messages are failed, not pending,
    and no notice offers `!retry`: the message is lost without a word. (Fixed: one
    write, finish_run(requeue=True); it failing leaves the run to the retry.)"""
    store = await SqlStore.open(cluster_db)
    try:
        leases = Leases(store.engine, ttl_s=4.0)
        gone = subprocess.Popen(["true"])
        gone.wait()
        z = Replica(
            "z", "z-1", socket.gethostname(), gone.pid, 0.0, 0.0, 0, 1, False,
            str(tmp_path / "z" / "state"),
        )  # fmt: skip
        await leases.register(z, alive=False)
        lease = await leases.acquire(ROOM, "z")
        assert lease is not None
        inbound = InboundMessage(ROOM, UserId("U1"), "never began", ExternalMessageId("z-1"))
        message = await store.accept(inbound, time.time())
        assert message is not None
        batch = Batch(ROOM, (message,))
        await store.start_run(RunId("run-z"), batch, time.time(), Fence("z", lease.token))
    finally:
        await store.close()
    finish = SqlStore.finish_run
    failures = 1

    async def failing_once(self: SqlStore, ending: RunEnding) -> Any:
        # The database away as the run's end and its messages' return are written
        # (one transaction now): nothing of it may stay half done.
        nonlocal failures
        if failures and ending.requeue:
            failures -= 1
            raise StoreError("the database is briefly away")
        return await finish(self, ending)

    monkeypatch.setattr(SqlStore, "finish_run", failing_once)
    async with replica(replica_settings(tmp_path, "b", cluster_db)) as b:
        await until(lambda: failures == 0, ANSWERED_S)
        await until(lambda: results(b.chat) == ["never began"], ANSWERED_S)


async def test_a_top_level_stop_heard_late_does_not_drop_what_came_after_it(
    tmp_path: Path, cluster_db: str
) -> None:
    """c8973d8: a top-level `!stop` on a tells the other replicas, which stop their
    threads when they hear it. b hears notices in its poll loop, after the poll's
    work (a takeover there can take seconds): a message sent after the `!stop` in
    a thread b owns, queued on b before b hears the notice, is dropped by it and
    never answered. (The replica that asked skips its own notice for this reason;
    the others apply the stop to whatever they hold when they hear it.)"""
    config = {"defaults": {"conversation": "thread"}}
    async with (
        replica(replica_settings(tmp_path, "a", cluster_db, config)) as a,
        replica(replica_settings(tmp_path, "b", cluster_db, config)) as b,
    ):
        await b.chat.say("on b", thread="t2")
        await b.chat.wait_until(lambda: results(b.chat) == ["on b"])
        # b's poll loop is busy: the notice is handled after the next message.
        queued = held_room_stops(b)
        await a.chat.say("!stop")
        await a.chat.wait_until(lambda: len(a.chat.texts(ReplyKind.NOTICE)) >= 1)
        await b.chat.say("after the stop", thread="t2")
        queued.set()
        await until(lambda: results(b.chat) == ["on b", "after the stop"], ANSWERED_S)


async def test_a_top_level_status_lists_a_thread_waiting_for_a_free_slot(
    tmp_path: Path, cluster_db: str
) -> None:
    """docs/conversations.md: at the top level `!status` lists the room's threads
    that have work. A thread message that came while every run slot was busy waits
    in the inbox, owned by no replica (placement): the room-wide `!status` (c8973d8)
    lists this replica's threads and the threads other replicas own, so it is in
    neither list. One process lists it ("waiting for a run slot")."""
    gate = tmp_path / "gate"
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_WAIT_FOR": str(gate)}
    config = {"defaults": {"conversation": "thread"}, "runner": {"max_concurrent_runs": 1}}
    async with replica(replica_settings(tmp_path, "a", cluster_db, config, env=env)) as a:
        await a.chat.say("busy", thread="t1")
        await until(lambda: a.service.parts.dispatcher.active_runs == 1, ANSWERED_S)
        await a.chat.say("waiting for a slot", thread="t2")  # the only slot is busy
        await a.chat.say("!status")
        await a.chat.wait_until(lambda: len(a.chat.texts(ReplyKind.NOTICE)) >= 1)
        status = a.chat.texts(ReplyKind.NOTICE)[-1]
        gate.touch()
        await until(lambda: len(results(a.chat)) == 2, ANSWERED_S)
    assert "t1" in status
    assert "t2" in status, status


async def test_an_edit_during_a_takeover_reaches_the_run(tmp_path: Path, cluster_db: str) -> None:
    """aaa9264: an edit whose message is not in this replica's queue goes to the
    conversation's owner; when that is this replica, "taken just now", nothing is
    done: "its recovery read the store as changed". Not so when the takeover's read
    of the pending messages was made before the edit was recorded and the edit's
    hand-over then waits for that takeover: the recovery queues the text from
    before the edit and the run answers that, though the store recorded the edit
    while the message still waited (the timing is forced here: the takeover's read
    is held until the edit is recorded)."""
    async with replica(replica_settings(tmp_path, "b", cluster_db)) as b:
        cluster = b.service.parts.cluster
        assert cluster is not None
        # Replica z owned the conversation and died: its lease runs for lease_ttl_s.
        assert await cluster.leases.acquire(ROOM, "z") is not None
        typo, _ = await b.chat.say("typo")  # for z: waits in the inbox
        store = b.service.store
        pending = store.pending_messages
        read, recorded = asyncio.Event(), asyncio.Event()

        async def held_read(*args: Any, **kwargs: Any) -> list[Message]:
            found = await pending(*args, **kwargs)
            if args and not read.is_set():  # the takeover's read (of one conversation)
                read.set()
                await recorded.wait()
            return found

        store.pending_messages = held_read  # type: ignore[method-assign]
        async with asyncio.timeout(ANSWERED_S):
            await read.wait()
        edit = asyncio.ensure_future(b.chat.edited(typo, "fixed"))
        conn = await asyncpg.connect(_asyncpg_dsn(cluster_db))
        try:
            async with asyncio.timeout(ANSWERED_S):
                while await conn.fetchval("SELECT text FROM messages WHERE id = 1") != "fixed":
                    await asyncio.sleep(0.01)
        finally:
            await conn.close()
        recorded.set()
        await edit
        await until(lambda: len(results(b.chat)) == 1, ANSWERED_S)
        assert results(b.chat) == ["fixed"]

"""Review of the late replica changes (698002d, 38dd0e4, e8ac713, e383d9a, aaa9264,
c8973d8, aef3243): defects found by trying to break them, each a test that fails on
the code it was written against (docs/replicas.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg

from bridge.cluster import Notice
from bridge.core.model import (
    Message,
    ReplyKind,
)
from tests.replicas.conftest import ROOM, replica, replica_settings, until
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
        cluster = b.service.cluster
        assert cluster is not None
        # Replica z owned the conversation and died: its lease runs for lease_ttl_s.
        assert await cluster.leases.acquire(ROOM, "z") is not None
        await b.chat.say("!stop")
        await b.chat.say("after the stop")
        await until(lambda: cluster.holds(ROOM), ANSWERED_S)
        await until(lambda: results(b.chat) == ["after the stop"], ANSWERED_S)


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
        cluster = b.service.cluster
        assert cluster is not None
        heard = cluster.on_notice
        assert heard is not None
        queued = asyncio.Event()

        async def late(notice: Notice) -> None:
            if notice.kind == "room-stop":
                # b's poll loop is busy: the notice is handled after the next message.
                await queued.wait()
            await heard(notice)

        cluster.on_notice = late
        await a.chat.say("!stop")
        await a.chat.wait_until(lambda: len(a.chat.texts(ReplyKind.NOTICE)) >= 1)
        await b.chat.say("after the stop", thread="t2")
        queued.set()
        await until(lambda: results(b.chat) == ["on b", "after the stop"], ANSWERED_S)


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
        cluster = b.service.cluster
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

"""Review of the late replica changes (698002d, 38dd0e4, e8ac713, e383d9a, aaa9264,
c8973d8, aef3243): defects found by trying to break them, each a test that fails on
the code it was written against (docs/replicas.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg

from bridge.core.model import ReplyKind
from tests.replicas.conftest import replica, replica_settings, until
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
        await until(lambda: a.service.dispatcher.active_runs == 1, ANSWERED_S)
        await a.chat.say("waiting for a slot", thread="t2")  # the only slot is busy
        await a.chat.say("!stop")
        await until(lambda: a.service.dispatcher.active_runs == 0, ANSWERED_S)
        gate.touch()
        # A few polls: the thread's message would be taken and run by now.
        await asyncio.sleep(3.0)
        assert "waiting for a slot" not in results(a.chat)
    conn = await asyncpg.connect(_asyncpg_dsn(cluster_db))
    try:
        rows = await conn.fetch("SELECT state FROM messages WHERE text = 'waiting for a slot'")
    finally:
        await conn.close()
    assert [r["state"] for r in rows] == ["dropped"]


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
        await until(lambda: a.service.dispatcher.active_runs == 1, ANSWERED_S)
        await a.chat.say("waiting for a slot", thread="t2")  # the only slot is busy
        await a.chat.say("!status")
        await a.chat.wait_until(lambda: len(a.chat.texts(ReplyKind.NOTICE)) >= 1)
        status = a.chat.texts(ReplyKind.NOTICE)[-1]
        gate.touch()
        await until(lambda: len(results(a.chat)) == 2, ANSWERED_S)
    assert "t1" in status
    assert "t2" in status, status

"""Review of the late replica changes (698002d, 38dd0e4, e8ac713, e383d9a, aaa9264,
c8973d8, aef3243): defects found by trying to break them, each a test that fails on
the code it was written against (docs/replicas.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg

from bridge.core.model import ReplyKind
from tests.replicas.conftest import ROOM, SlackRoom, replica, replica_settings, until
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

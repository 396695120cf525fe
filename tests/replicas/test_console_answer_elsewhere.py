"""A request answered from the web console of a replica that does not run its
conversation reaches claude through the replica that does (docs/web.md, "The pages";
docs/replicas.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from bridge.core.model import ReplyKind, UserId
from bridge.core.transport import ApprovalChoice
from bridge.web.actions import DeskActions
from tests.replicas.conftest import ROOM, Replica, replica, replica_settings, until

GUARD_S = 60.0


@asynccontextmanager
async def answered_on_b(tmp_path: Path, cluster_db: str) -> AsyncIterator[tuple[Replica, str]]:
    """Replica a runs the room's conversation, which waits on request #1; b's console
    allows it. Yields a and what b's console told its user."""
    config = {"defaults": {"approve_tools": True}}
    async with asyncio.timeout(GUARD_S):
        async with (
            replica(replica_settings(tmp_path, "a", cluster_db, config)) as a,
            replica(replica_settings(tmp_path, "b", cluster_db, config)) as b,
        ):
            await a.chat.say("ask me")
            await a.chat.wait_until(lambda: any("(request `#1`" in t for t in a.chat.texts()))
            store = a.service.store
            while any(p.message_id is None for p in await store.pending_approvals()):
                await asyncio.sleep(0.01)  # its post recorded
            assert a.service.parts.cluster is not None
            await until(
                lambda: a.service.parts.cluster is not None and a.service.parts.cluster.holds(ROOM)
            )
            [pending] = await b.service.store.pending_approvals()
            console = DeskActions(
                b.service.store, b.service.parts.approvals.desk(), b.service.settings.room
            )
            told = await console.answer((UserId("U1"),), pending.id, ApprovalChoice.ALLOW, "")
            yield a, told


async def test_an_answer_from_another_replicas_console_reaches_claude(
    tmp_path: Path, cluster_db: str
) -> None:
    """Was: b recorded the answer and told its own runs, none of which is the one
    asking: the person read "(The run had already ended.)" and claude waited on."""
    async with answered_on_b(tmp_path, cluster_db) as (a, told):
        assert "already ended" not in told
        await a.chat.wait_until(lambda: "ask me" in a.chat.texts(ReplyKind.RESULT))


async def test_a_console_answer_handed_to_another_replica_says_it_may_wait_for_a_slot(
    tmp_path: Path, cluster_db: str
) -> None:
    """b cannot know whether a's run gets a slot back at once: the console says the
    answer is recorded and the run goes on, at once or when a run slot frees. Was:
    only "allowed", as if claude had it, though it may wait for a slot."""
    async with answered_on_b(tmp_path, cluster_db) as (a, told):
        assert "recorded" in told.lower(), told
        assert "when a run slot frees" in told, told
        await a.chat.wait_until(lambda: "ask me" in a.chat.texts(ReplyKind.RESULT))

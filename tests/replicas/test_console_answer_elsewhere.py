"""A request answered from the web console of a replica that does not run its
conversation reaches claude through the replica that does (docs/web.md, "The pages";
docs/replicas.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bridge.core.model import ReplyKind, UserId
from bridge.core.transport import ApprovalChoice
from bridge.web.actions import DeskActions
from tests.replicas.conftest import ROOM, replica, replica_settings, until

GUARD_S = 60.0


async def test_an_answer_from_another_replicas_console_reaches_claude(
    tmp_path: Path, cluster_db: str
) -> None:
    """Was: b recorded the answer and told its own runs, none of which is the one
    asking: the person read "(The run had already ended.)" and claude waited on."""
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
            assert "already ended" not in told
            await a.chat.wait_until(lambda: "ask me" in a.chat.texts(ReplyKind.RESULT))

"""A question or a tool request waiting in chat survives a takeover by another replica:
the run goes on on its detached supervisor, the new owner reattaches to it, the request
is not posted again, and an answer given through the new owner reaches claude
(docs/replicas.md, "Failover"; docs/live-runs.md, "Questions and plans")."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bridge.core.model import ReplyKind
from bridge.store.base import ApprovalState
from dispatcher import EndReason
from tests.bridge.chat_room import ChatRoom
from tests.bridge.harness import ECHO
from tests.bridge.questions import SINGLE
from tests.replicas.conftest import ROOM, replica, replica_settings, until

GUARD_S = 60.0
QUESTION = {"questions": [SINGLE]}


def posts(chat: ChatRoom, text: str) -> int:
    return sum(text in r.text for r in chat.replies)


ASKS = {
    "question": (
        {"FAKE_CLAUDE_QUESTION": json.dumps(QUESTION), "FAKE_CLAUDE_NO_TOOL": "1"},
        "Claude asks (question `#1`)",
        "!answer #1 2",
        {**QUESTION, "answers": {"Which database?": "PostgreSQL"}},
    ),
    "tool request": ({}, "(request `#1`", "!approve #1", {"command": "echo hello"}),
}


@pytest.mark.parametrize("how", ["leaves", "dies"])
@pytest.mark.parametrize("kind", list(ASKS))
async def test_a_request_waiting_when_its_replica_goes_is_answered_through_the_next(
    tmp_path: Path, cluster_db: str, how: str, kind: str
) -> None:
    """``leaves``: a stops (``on_shutdown = "detach"``: its run goes on on its
    supervisor). ``dies``: as a kill -9 leaves it, in one process: its runs left to
    their supervisors, nothing handed over, its leases left to expire."""
    asks, asked, answer, ran_with = ASKS[kind]
    tools = tmp_path / "tools.jsonl"
    env = {**ECHO, **asks, "FAKE_CLAUDE_TOOL_LOG": str(tools)}
    config = {"defaults": {"approve_tools": True}}
    async with asyncio.timeout(GUARD_S):
        async with replica(replica_settings(tmp_path, "b", cluster_db, config, env=env)) as b:
            async with replica(replica_settings(tmp_path, "a", cluster_db, config, env=env)) as a:
                await a.chat.say("ask me")
                await a.chat.wait_until(lambda: posts(a.chat, asked) == 1)
                store = a.service.store
                while not await store.live_runs() or any(
                    p.message_id is None for p in await store.pending_approvals()
                ):
                    await asyncio.sleep(0.01)  # registered (detachable) and its post recorded
                if how == "dies":
                    # The cut-off detaches the runs (as a kill leaves them), then no
                    # graceful step at all.
                    drained = asyncio.ensure_future(
                        a.service.parts.dispatcher.drain(GUARD_S, reason=EndReason.DETACHED)
                    )
                    a.die()
                    await asyncio.wait({a.task})
                    drained.cancel()
                    await asyncio.wait({drained})
            # b takes the conversation over (a's run is still marked running: work),
            # reattaches to the run's supervisor and finds the request still waiting.
            assert b.service.parts.cluster is not None
            await until(
                lambda: b.service.parts.cluster is not None and b.service.parts.cluster.holds(ROOM)
            )
            await until(lambda: b.service.parts.dispatcher.active_runs == 1)
            # Still waiting for a person on b: the run lent b's slot too.
            await until(lambda: b.service.parts.dispatcher.lent_runs == 1)
            await b.chat.say(answer)
            await b.chat.wait_until(lambda: "ask me" in b.chat.texts(ReplyKind.RESULT))
            approval = await b.service.store.approval_by_number(ROOM, 1)
    # Posted once, by a; b re-posted nothing of it.
    assert posts(a.chat, asked) == 1
    assert posts(b.chat, asked) == 0
    ran = [json.loads(line) for line in tools.read_text().splitlines()]
    assert ran == [ran_with]
    assert approval is not None
    assert approval.state is ApprovalState.ALLOWED

"""Replicas as real processes (docs/replicas.md): three ``chatbridge run`` on a private
PostgreSQL, local-slack in Events mode behind HAProxy; replicas killed, paused and
restarted, PostgreSQL restarted, while messages flow. At the end, from the fake
claude's run log and the bridge's inbox: no accepted message lost, none run
twice, never two runs of one conversation at once."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from tests.cluster.fixtures import private_postgres
from tests.cluster.postgres_server import PostgresServer
from tests.cluster.slack_cluster import SlackCluster, failover_s, slack_cluster

pytestmark = [pytest.mark.slack, pytest.mark.slow, pytest.mark.postgres]

__all__ = ["private_postgres"]

SLOW_RUNS = {"FAKE_CLAUDE_TOOL_SECONDS": "0.4", "FAKE_CLAUDE_NO_TOOL": ""}
"""Runs that last a while, so a kill finds some running."""


async def steady_load(c: SlackCluster, count: int, every_s: float = 0.03) -> None:
    """``count`` messages round robin over the conversations, one at a time."""
    for i in range(count):
        await c.post(i % c.conversations)
        await asyncio.sleep(every_s)  # a rate, not a synchronisation


async def test_three_replicas_behind_haproxy_answer_every_message_once(
    tmp_path: Path, private_postgres: PostgresServer
) -> None:
    async with slack_cluster(tmp_path, private_postgres, conversations=12) as c:
        await steady_load(c, 48, every_s=0)
        await c.settled()
        verdict = await c.check()
        accepted = await c.accepted()
        assert sorted(accepted) == sorted(p.text for p in c.posted)
        for i in range(c.conversations):
            answers = await c.answered_texts(i)
            for p in c.posted:
                if p.text.startswith(f"C0R{i:02d}-"):
                    assert p.text in answers, f"{p.text} not answered in its channel"
    ran_on = {run.cwd for run in verdict.runs}
    assert len(ran_on) == 12

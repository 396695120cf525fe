"""Placement counts the runs holding a run slot: a replica whose runs wait for people
(their slots lent) takes new conversations (docs/live-runs.md, "Waiting runs and the
run slots")."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bridge.cluster.status_report import status_text
from tests.replicas.conftest import ROOM, Replica, replica, replica_settings, until
from tests.replicas.replicas import results

GUARD_S = 60.0


def asked(r: Replica) -> int:
    return sum("(request `#1`" in t for t in r.chat.texts())


async def test_a_replica_whose_only_run_waits_for_a_person_takes_a_new_conversation(
    tmp_path: Path, cluster_db: str
) -> None:
    config = {
        "runner": {"max_concurrent_runs": 1, "prestart": False},
        "defaults": {"conversation": "thread", "approve_tools": True},
    }
    settings = replica_settings(tmp_path, "a", cluster_db, config)
    async with asyncio.timeout(GUARD_S):
        async with replica(settings) as a:
            await a.chat.say("first job", thread="t1")
            await a.chat.wait_until(lambda: asked(a) == 1)
            await until(lambda: a.service.parts.dispatcher.lent_runs == 1)
            # A new conversation: a has no free slot but the one its waiting run lent.
            await a.chat.say("second job", thread="t2")
            # (Each conversation numbers its own requests.)
            await a.chat.wait_until(lambda: asked(a) == 2)
            assert a.service.parts.cluster is not None
            assert a.service.parts.cluster.holds(ROOM.in_thread("t2"))
            assert a.service.parts.dispatcher.active_runs == 2
            # `chatbridge status` counts what placement counts, and says so. Was: "runs
            # 0/1" of a replica running two (their slots lent).
            while "slots held 0/1" not in await status_text(settings):
                await asyncio.sleep(0.05)  # the next heartbeat
            # Both answered: each takes a slot back in turn and ends.
            await a.chat.say("!deny #1", thread="t1")
            await a.chat.say("!deny #1", thread="t2")
            await a.chat.wait_until(lambda: len(results(a)) == 2)
            assert sorted(results(a)) == ["first job", "second job"]


async def test_with_a_cluster_cap_a_run_waiting_for_a_person_keeps_its_slot(
    tmp_path: Path, cluster_db: str
) -> None:
    """The cluster cap counts the runs waiting for a person: a slot one lent would go
    to a run that then waits for the cluster cap, holding it, while the answered run
    waits for it back. Was: neither went on (until a time limit or a !stop)."""
    config = {
        "runner": {"max_concurrent_runs": 1, "prestart": False},
        "cluster": {"max_concurrent_runs": 1},
        "defaults": {"conversation": "thread", "approve_tools": True},
    }
    async with asyncio.timeout(GUARD_S):
        async with replica(replica_settings(tmp_path, "a", cluster_db, config)) as a:
            await a.chat.say("first job", thread="t1")
            await a.chat.wait_until(lambda: asked(a) == 1)
            await a.chat.say("second job", thread="t2")
            # t2 waits: untaken (a has no free slot), or, given a's slot, for the cluster's.
            cluster = a.service.parts.cluster
            assert cluster is not None
            await until(
                lambda: (
                    not cluster.holds(ROOM.in_thread("t2"))
                    or any("cluster is busy" in t for t in a.chat.texts())
                )
            )
            await a.chat.say("!approve #1", thread="t1")
            await a.chat.wait_until(lambda: "first job" in results(a))
            await a.chat.wait_until(lambda: asked(a) == 2)  # then t2 runs
            await a.chat.say("!approve #1", thread="t2")
            await a.chat.wait_until(lambda: sorted(results(a)) == ["first job", "second job"])

"""Only the owner speaks for a conversation (docs/replicas.md): a replica that finds, on
waking from a pause, that it lost the conversation's lease says nothing more of the run
it had (no answer, no failure or stop notice, no reaction; what it records is the
owner's to deliver), and the new owner's notice says what happened: that replica
stopped answering (not "chatbridge restarted")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import asyncpg
import pytest

from bridge.cluster.role import ClusterRole
from bridge.core.model import Batch, ExternalMessageId, InboundMessage, ReplyKind, RunId, UserId
from bridge.core.transport import RunPhase
from tests.bridge.harness import ECHO
from tests.replicas.conftest import ROOM, replica, replica_settings, until
from tests.store.conftest import _asyncpg_dsn

GUARD_S = 15.0


@pytest.mark.parametrize("ending", ["claude answers", "the run is stopped"])
async def test_a_replica_that_lost_the_lease_says_nothing_more_of_its_run(
    tmp_path: Path, cluster_db: str, ending: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the executor is told of the loss below; its cluster still holds the room and
    # would deliver the recorded replies as their owner: its recheck stays out of it.
    async def no_recheck(self: ClusterRole) -> None:
        return None

    monkeypatch.setattr(ClusterRole, "recheck", no_recheck)
    gate = tmp_path / "gate"
    env = {**ECHO, "FAKE_CLAUDE_WAIT_FOR": str(gate)}
    async with replica(replica_settings(tmp_path, "a", cluster_db, env=env)) as a:
        said, _ = await a.chat.say("a long one")
        await a.chat.wait_until(lambda: a.chat.phases.get(said) is RunPhase.RUNNING)

        # Paused past its lease: on waking, its own clock says the conversation is gone.
        a.service.parts.executor.holds = lambda room: False
        if ending == "claude answers":
            gate.touch()
        else:
            a.service.parts.dispatcher.stop(ROOM)  # as the cluster letting go of the room does
        await until(lambda: a.service.parts.dispatcher.active_runs == 0, GUARD_S)
        assert a.chat.texts(ReplyKind.RESULT) == []
        assert a.chat.texts(ReplyKind.NOTICE) == []
        assert a.chat.phases[said] is RunPhase.RUNNING  # no ✅, ❌ or 🛑 from it
    conn = await asyncpg.connect(_asyncpg_dsn(cluster_db))
    try:
        status = await conn.fetchval("SELECT status FROM runs")
        sent = await conn.fetchval("SELECT count(*) FROM outbox WHERE state <> 'pending'")
    finally:
        await conn.close()
    # Recorded (the first report of a run stands: the new owner's, had it reported
    # first), and what it recorded to say is left for the owner to deliver.
    assert status == ("succeeded" if ending == "claude answers" else "stopped")
    assert sent == 0


async def test_a_run_taken_over_from_a_replica_is_reported_as_that_replica_stopping(
    tmp_path: Path, cluster_db: str
) -> None:
    async with replica(replica_settings(tmp_path, "b", cluster_db)) as b:
        store = b.service.store
        inbound = InboundMessage(ROOM, UserId("U1"), "a long one", ExternalMessageId("m-1"))
        message = await store.accept(inbound, 100.0)
        assert message is not None
        run_id = RunId("run-of-a")
        await store.start_run(run_id, Batch(ROOM, (message,)), 101.0)
        run = await store.get_run(run_id)
        assert run is not None
        # Left running by replica a, which stopped answering (paused, or dead).
        await b.service.parts.recovery.recover_run(
            dataclasses.replace(run, replica="a"), None, False
        )
        await b.chat.wait_until(lambda: bool(b.chat.texts(ReplyKind.NOTICE)))
        [notice] = b.chat.texts(ReplyKind.NOTICE)
        ended = await store.get_run(run_id)
    assert notice == (
        "The last run (`run-of-a`) did not finish: replica `a`, which ran it, stopped"
        " answering, and another replica took the conversation over. If its answer is not"
        " above, `!retry run-of-a` runs it again."
    )
    assert "restarted" not in notice
    assert ended is not None
    assert ended.report is not None
    assert ended.report.error == "replica a stopped answering during the run"

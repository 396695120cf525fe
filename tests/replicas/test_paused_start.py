"""A replica paused between recording a run's start and starting claude (found by the
chaos test: one message run twice, two runs of one conversation at once).

While it is paused its lease runs out; the conversation's new owner finds the run
marked running with no directory and no supervisor, takes it for one that never
began, and runs its messages. On waking, the paused replica must not start claude
for them too, nor record anything of the run: it asks whether it still holds the
conversation just before the spawn (``run_claude``'s ``may_start``), and its own
clock says no (no renewal for the lease's lifetime).
"""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from bridge.core.model import Batch, ReplyKind, RoomKey, RunId
from bridge.runs.executor import RunExecutor
from tests.bridge.harness import ECHO
from tests.replicas.conftest import replica, replica_settings, until
from tests.store.conftest import _asyncpg_dsn

GUARD_S = 15.0


async def test_a_replica_that_lost_the_conversation_after_recording_a_start_starts_no_claude(
    tmp_path: Path, cluster_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = RunExecutor._start
    started: list[RunId] = []

    async def start_then_wake_without_the_lease(
        self: RunExecutor, run_id: RunId, batch: Batch, at: float
    ) -> bool:
        recorded = await record(self, run_id, batch, at)
        started.append(run_id)

        # Paused here past the lease: on waking, its clock finds the lease gone.
        def lost(room: RoomKey) -> bool:
            return False

        self.holds = lost
        return recorded

    monkeypatch.setattr(RunExecutor, "_start", start_then_wake_without_the_lease)
    spawned = tmp_path / "spawned.json"
    env = {**ECHO, "FAKE_CLAUDE_RECORD": str(spawned)}
    async with replica(replica_settings(tmp_path, "a", cluster_db, env=env)) as a:
        await a.chat.say("only on the new owner")
        await until(lambda: bool(started) and a.service.parts.dispatcher.active_runs == 0, GUARD_S)
        assert list(a.chat.texts(ReplyKind.RESULT)) == []
    assert not spawned.exists()  # no claude was started for it
    conn = await asyncpg.connect(_asyncpg_dsn(cluster_db))
    try:
        run = await conn.fetchrow("SELECT status FROM runs WHERE id = $1", started[0])
        message = await conn.fetchrow("SELECT state FROM messages")
        outbox = await conn.fetchval("SELECT count(*) FROM outbox")
    finally:
        await conn.close()
    # Nothing recorded: left as it was for the new owner's recovery (which finds no
    # run directory and runs the message as if the run never began).
    assert run is not None
    assert run["status"] == "running"
    assert message is not None
    assert message["state"] == "dispatched"
    assert outbox == 0
    assert not (tmp_path / "a" / "state" / "runs" / started[0]).exists()

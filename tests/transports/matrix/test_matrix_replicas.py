"""Matrix with the leader lease, against Synapse: two ``chatbridge run`` replicas on one
PostgreSQL share one bot account and one ``[matrix] store_path`` (docs/replicas.md,
"Transports"). Only the leader syncs, so a message is answered once; when the leader
is killed, the other takes the lease and goes on from the shared sync position.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import pytest

from tests.config_files import merged, write_toml
from tests.replicas.conftest import cluster_db
from tests.replicas.replicas import ReplicaProcess
from tests.replicas.slack_cluster import free_ports
from tests.service_process import base_config
from tests.store.conftest import _asyncpg_dsn
from tests.transports.matrix.matrix_helpers import Human, joined
from tests.transports.matrix.seen import ALICE, ECHO, answer_in
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

__all__ = ["cluster_db"]  # the fixture, imported for this module

LEADING = "leading matrix"
"""bridge.cluster.replica's line when a replica takes the Matrix leader lease."""
GUARD_S = 30.0
DEVICE = re.compile(r"matrix connected as \S+ \(device (\S+)\)")


def replicas(
    tmp: Path, synapse: SynapseServer, bot: MatrixUser, room: str, database: str
) -> dict[str, ReplicaProcess]:
    """Replicas a and b: one config file (shared store_path), own ids, state dirs, ports."""
    config = merged(
        base_config(tmp),
        {
            "database": {"url": database},
            "cluster": {"enabled": True, "lease_ttl_s": 3, "poll_s": 0.3},
            "matrix": {
                "homeserver": synapse.url,
                "user_id": bot.user_id,
                "store_path": tmp / "matrix-store",
                "sync_timeout_ms": 5000,
            },
            "rooms": [{"transport": "matrix", "id": room, "allowed_users": [ALICE]}],
        },
    )
    path = write_toml(tmp / "chatbridge.toml", config)
    env = {**ECHO, "CHATBRIDGE_MATRIX__PASSWORD": bot.password}
    ports = free_ports(2)
    return {
        name: ReplicaProcess(name, path, tmp / name, port, None, env)
        for name, port in zip(("a", "b"), ports, strict=True)
    }


async def logged(replica: ReplicaProcess, text: str) -> None:
    """Until ``replica`` has logged a line with ``text`` (its log is read as it comes)."""
    async with asyncio.timeout(GUARD_S):
        while not any(text in line for line in replica.log):
            await asyncio.sleep(0.02)


def devices(replica: ReplicaProcess) -> list[str]:
    """The Matrix devices ``replica`` connected as."""
    return [m.group(1) for line in replica.log if (m := DEVICE.search(line))]


async def first_to_lead(group: dict[str, ReplicaProcess]) -> ReplicaProcess:
    waits = {asyncio.ensure_future(logged(r, LEADING)): r for r in group.values()}
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.wait(waits)
    return waits[done.pop()]


async def runs_by_replica(url: str) -> list[str | None]:
    conn = await asyncpg.connect(_asyncpg_dsn(url))
    try:
        rows = await conn.fetch("SELECT replica FROM runs ORDER BY seq")
    finally:
        await conn.close()
    return [row["replica"] for row in rows]


async def test_the_leader_answers_once_and_the_other_takes_over_after_kill_9(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human, cluster_db: str
) -> None:
    room = await alice.create_room([bot.user_id])
    group = replicas(tmp_path, synapse, bot, room, cluster_db)
    try:
        await asyncio.gather(*(r.start() for r in group.values()))
        leader = await first_to_lead(group)
        [follower] = [r for r in group.values() if r is not leader]
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "first question")
        first = await alice.wait_for(answer_in(bot, room))
        assert not any(LEADING in line for line in follower.log), follower.tail()

        await leader.kill()
        await alice.send(room, "second question, after the kill")
        second = await alice.wait_for(
            lambda s: answer_in(bot, room)(s) and "second" in s.content["body"]
        )
        assert any(LEADING in line for line in follower.log), follower.tail()
        # A third message: its answer is the barrier after which a repeat
        # of an earlier answer would have shown up.
        await alice.send(room, "third")
        await alice.wait_for_all(answer_in(bot, room), count=3)
    except BaseException:
        for r in group.values():
            print(f"===== {r.name}\n{r.tail(80)}")
        raise
    finally:
        await asyncio.gather(*(r.terminate() for r in group.values()))
    answers = [s.content["body"] for s in alice.seen if answer_in(bot, room)(s)]
    assert len(answers) == 3, answers
    assert "first question" in first.content["body"]
    assert "first" not in second.content["body"]
    assert "third" in answers[2]
    assert "second" not in answers[2]
    assert await runs_by_replica(cluster_db) == [leader.name, follower.name, follower.name]
    # One device: the new leader went on from the shared store, without a new login.
    assert len(devices(leader)) == 1
    assert devices(follower) == devices(leader)


async def test_a_leader_paused_past_its_lease_stops_instead_of_syncing_beside_the_new_one(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human, cluster_db: str
) -> None:
    room = await alice.create_room([bot.user_id])
    group = replicas(tmp_path, synapse, bot, room, cluster_db)
    try:
        await asyncio.gather(*(r.start() for r in group.values()))
        leader = await first_to_lead(group)
        [follower] = [r for r in group.values() if r is not leader]
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "first question")
        await alice.wait_for(answer_in(bot, room))

        leader.pause()
        await logged(follower, LEADING)
        await alice.send(room, "second question, while the leader is paused")
        await alice.wait_for(lambda s: answer_in(bot, room)(s) and "second" in s.content["body"])
        leader.resume()  # (a no-op if it was killed, paused holding the store's lock)
        assert leader.process is not None
        async with asyncio.timeout(GUARD_S):
            code = await leader.process.wait()
        await alice.send(room, "third")
        await alice.wait_for_all(answer_in(bot, room), count=3)
    except BaseException:
        for r in group.values():
            print(f"===== {r.name}\n{r.tail(80)}")
        raise
    finally:
        await asyncio.gather(*(r.terminate() for r in group.values()))
    assert code != 0
    # It stops itself once it runs again; or, paused inside a transaction on
    # the Matrix store (its lock held), the new leader killed it (the next test).
    assert any("lost the leader lease" in line for line in leader.log) or any(
        f"replica process {leader.pid} is stopped" in line for line in follower.log
    ), leader.tail()
    answers = [s.content["body"] for s in alice.seen if answer_in(bot, room)(s)]
    assert len(answers) == 3, answers
    assert ["first" in a for a in answers] == [True, False, False]
    assert ["third" in a for a in answers] == [False, False, True]
    assert await runs_by_replica(cluster_db) == [leader.name, follower.name, follower.name]


HOLD_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(600)
"""
"""A transaction on the store left open: its lock held, as by a leader paused inside one."""


async def register(url: str, replica: str, pid: int) -> None:
    """Record ``pid`` as replica ``replica`` of this host (as its own start would)."""
    conn = await asyncpg.connect(_asyncpg_dsn(url))
    try:
        await conn.execute(
            "INSERT INTO replicas (id, instance, host, pid, started_at, heartbeat_at)"
            " VALUES ($1, $2, $3, $4, $5, $5)",
            replica, str(uuid.uuid4()), socket.gethostname(), pid, time.time(),
        )  # fmt: skip
    finally:
        await conn.close()


async def test_a_replica_paused_holding_the_store_lock_is_killed_by_the_new_leader(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human, cluster_db: str
) -> None:
    # Encrypted: the new leader must write to the store (its key queries) to go on.
    room = await alice.create_room([bot.user_id], encrypted=True)
    group = replicas(tmp_path, synapse, bot, room, cluster_db)
    holder = None
    try:
        await asyncio.gather(*(r.start() for r in group.values()))
        leader = await first_to_lead(group)
        [follower] = [r for r in group.values() if r is not leader]
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "first question")
        await alice.wait_for(answer_in(bot, room))

        [store] = (tmp_path / "matrix-store").glob("*.db")
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOLD_LOCK, str(store), stdout=asyncio.subprocess.PIPE
        )
        assert holder.stdout is not None
        assert await holder.stdout.readline() == b"locked\n"
        holder.send_signal(signal.SIGSTOP)
        await register(cluster_db, "z", holder.pid)
        leader.pause()
        await logged(follower, LEADING)
        await alice.send(room, "second question, while the store is locked")
        await alice.wait_for(lambda s: answer_in(bot, room)(s) and "second" in s.content["body"])
        async with asyncio.timeout(GUARD_S):
            assert await holder.wait() == -signal.SIGKILL
    except BaseException:
        for r in group.values():
            print(f"===== {r.name}\n{r.tail(80)}")
        raise
    finally:
        if holder is not None and holder.returncode is None:
            holder.kill()
            await holder.wait()
        for r in group.values():
            if r.alive:
                r.resume()
        await asyncio.gather(*(r.terminate() for r in group.values()))
    assert any(f"replica process {holder.pid} is stopped" in line for line in follower.log)

"""Review 2: which pids a new Matrix leader may kill as its paused predecessor (failing)."""

from __future__ import annotations

import os
import socket
import time
from typing import Any, cast

from bridge.cluster.replica import Cluster
from bridge.config import ClusterSettings
from bridge.metrics import Metrics
from bridge.store.cluster import Leases, Replica


class Rows:
    """``Leases`` as far as ``neighbours`` reads it."""

    def __init__(self, rows: list[Replica]) -> None:
        self.rows = rows

    async def replicas(self) -> list[Replica]:
        return self.rows


def row(replica_id: str, pid: int, heartbeat_at: float) -> Replica:
    return Replica(
        replica_id,
        "instance",
        socket.gethostname(),
        pid,
        heartbeat_at - 60,
        heartbeat_at,
        0,
        4,
        False,
    )


async def test_a_replica_row_left_by_a_crash_long_ago_is_no_neighbour() -> None:
    # A replica's row is deleted only when it exits cleanly (Leases.release_all): one killed,
    # or crashed, and never started again under its id stays forever. Its pid is free
    # for any process of the host since: a stopped one holding the Matrix store's lock
    # (an operator's sqlite3 on the store, suspended by ^Z) is then killed by the next
    # leader as "a replica" (bridge/cluster/paused_holders.py). Only replicas alive by their
    # heartbeat are replicas.
    settings = ClusterSettings(enabled=True, lease_ttl_s=5.0)
    now = time.time()
    leases = Rows([row("crashed-last-week", 4242, now - 7 * 86400), row("alive", 4343, now)])
    cluster = Cluster(
        settings,
        cast(Leases, leases),
        Metrics(),
        4,
        lambda: 0,
        "/tmp/state",
        serves=lambda transport: True,
        replica_id="me",
    )
    neighbours: Any = await cluster.neighbours()
    assert 4343 in neighbours
    assert os.getpid() not in neighbours
    assert 4242 not in neighbours

"""``chatbridge status``: the cluster as the database sees it (docs/replicas.md).

Replicas with their heartbeat's age and run slots held, the leases (who owns which
conversation, and until when), the runs marked running, and the inbox's lag
(pending messages, and the oldest one's age). Read-only, from any machine
that reaches the database; a single chatbridge shows its runs and inbox.
"""

from __future__ import annotations

import time

from bridge.config import Settings
from bridge.store.cluster import Leases
from bridge.store.sql import SqlStore


async def status_text(settings: Settings) -> str:
    store = await SqlStore.open(settings.database.url, auto_migrate=False)
    try:
        lines: list[str] = []
        if store.engine.url.get_backend_name() == "postgresql":
            lines += await _cluster_lines(
                Leases(store.engine, settings.cluster.lease_ttl_s), settings
            )
        else:
            lines.append("replicas: none (a SQLite database serves one chatbridge)")
        running = await store.running_runs()
        lines.append(f"runs: {len(running)} running")
        for run in running:
            lines.append(
                f"  {run.id}  {run.room}  replica {run.replica or '-'}"
                f"  for {time.time() - run.started_at:.0f}s"
            )
        pending = await store.pending_messages()
        oldest = min((m.received_at for m in pending), default=None)
        lag = "" if oldest is None else f", oldest {time.time() - oldest:.1f}s old"
        lines.append(f"inbox: {len(pending)} pending{lag}")
        return "\n".join(lines)
    finally:
        await store.close()


async def _cluster_lines(leases: Leases, settings: Settings) -> list[str]:
    lines: list[str] = []
    now = await leases.now()
    replicas = await leases.replicas()
    lines.append(f"replicas: {len(replicas)}")
    for r in replicas:
        age = now - r.heartbeat_at
        state = "stale" if age > settings.cluster.lease_ttl_s else "live"
        if r.draining:
            state += ", draining"
        lines.append(
            # A run waiting for a person lent its slot: it is not among those held.
            f"  {r.id}  {state}  host {r.host} pid {r.pid}  slots held {r.runs}/{r.capacity}"
            f"  heartbeat {age:.1f}s ago  up {now - r.started_at:.0f}s"
        )
    held = await leases.leases()
    live = [(lease, ok) for lease, ok in held if ok]
    lines.append(f"leases: {len(live)} live, {len(held) - len(live)} expired")
    for lease, ok in held:
        what = f"{lease.room.transport} leader" if not lease.room.room_id else str(lease.room)
        left = lease.expires_at - now
        until = f"expires in {left:.1f}s" if ok else f"expired {-left:.1f}s ago"
        lines.append(f"  {what}  owner {lease.owner}  token {lease.token}  {until}")
    return lines

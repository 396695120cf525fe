"""What a start does with the runs a previous process left: reattach, interrupt, re-queue.

:meth:`Recovery.recover` runs once, before the transports connect: a run in the registry
of live runs on this host goes back to its room as that room's active run (reattached to
its supervisor); any other run still marked running is stopped and reported interrupted
(its notice recorded with its outcome, in one transaction), or, if it never started, its
messages wait to run again; then stray run directories go and pending messages are
re-queued. A replica keeps the conversations it held and stops its runs in the others
(docs/detached-runs.md; docs/replicas.md, "Replicas and leases").
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge.cluster.replica import Cluster
from bridge.config import Settings
from bridge.core.model import Batch, Reply, ReplyKind, RoomKey, RunId, RunReport, RunStatus
from bridge.errors import StartupError
from bridge.inbound.intake import Intake
from bridge.live.approval_flow import ApprovalFlow
from bridge.outbound.replies import in_conversation
from bridge.runs.executor import RunExecutor
from bridge.runs.stale_runs import interruption_text, never_started
from bridge.store.base import Approval, RegisteredRun, RunEnding, RunRecord, Store
from bridge.store.cluster import ReplicaIdInUse
from dispatcher import Dispatcher
from runner import clean_stray_runs, journal_exists, recover_run, remove_run_dir

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Recovery:
    """The runs left from before this process, recovered once at start (see the module)."""

    settings: Settings
    store: Store
    dispatcher: Dispatcher
    executor: RunExecutor
    intake: Intake
    approvals: ApprovalFlow
    closed: Callable[[list[Approval]], None]
    """Shows the tool requests of interrupted runs closed (once connected)."""
    cluster: Cluster | None = None
    adopted: set[RunId] = field(default_factory=set)
    """Runs reattached at start: their run directories are not strays."""

    async def recover(self) -> None:
        """Reattach the runs a previous process left running, sweep the rest, re-queue
        what never ran."""
        if self.cluster is not None:
            await self._recover_replica(self.cluster)
            return
        registered = {entry.live.run_id: entry for entry in await self.store.live_runs()}
        adopted: set[RunId] = set()
        state_dir = self.settings.runner.state_dir
        for run in await self.store.running_runs():
            entry = registered.get(run.id)
            never = never_started(run, entry, state_dir)
            if await self.recover_run(run, entry, True, never_started=never):
                adopted.add(run.id)
        await self._clean_strays(adopted)
        resumed = await self.intake.recover(await self.store.pending_messages())
        if resumed:
            log.info("re-queued %d message(s) accepted before the restart", resumed)

    async def _recover_replica(self, cluster: Cluster) -> None:
        """A replica's start (docs/replicas.md): join, keep the conversations it held
        (each recovered as it is kept), and stop its own runs in conversations it
        no longer holds. Pending messages elsewhere are found by the poll."""
        try:
            await cluster.register()
        except ReplicaIdInUse as exc:
            raise StartupError(f"cluster.replica_id: {exc}") from None
        kept = set(await cluster.keep_own())
        registered = {entry.live.run_id: entry for entry in await self.store.live_runs()}
        state_dir = self.settings.runner.state_dir
        followed_elsewhere: set[RunId] = set()
        for run in await self.store.running_runs():
            if run.replica == cluster.replica_id:
                if run.room not in kept and await _owned_elsewhere(cluster, run.room):
                    # Its conversation's new owner recovered it (it may be following
                    # the run from this host): not this replica's to stop any more.
                    followed_elsewhere.add(run.id)
                    continue
                # A kept conversation is recovered as a restart recovers: its
                # detached run reattached (or reported); in the others it is stopped.
                entry = registered.get(run.id)
                never = never_started(run, entry, state_dir)
                await self.recover_run(run, entry, run.room in kept, never_started=never)
        # After the recovery: the runs it reattached, and those another replica
        # follows, are not strays.
        await self._clean_strays(set(self.adopted) | followed_elsewhere)
        if kept:
            pending = [m for m in await self.store.pending_messages() if m.room in kept]
            await self.intake.recover(pending, keep_commands=True)
            log.info("kept %d conversation(s) held before the restart", len(kept))

    async def _clean_strays(self, adopted: set[RunId]) -> None:
        # Run directories of runs that are no longer running (their outcome is
        # recorded, or they never got registered): whatever is left of them goes.
        killed = await clean_stray_runs(
            self.settings.runner.state_dir, set(adopted), self.settings.runner.cgroup_root
        )
        if killed:
            log.warning("stopped %d process(es) of runs no record names", killed)

    async def recover_run(
        self,
        run: RunRecord,
        entry: RegisteredRun | None,
        may_follow: bool,
        *,
        never_started: bool = False,
    ) -> bool:
        """Reattach one run left running (True), or stop it and report it interrupted.

        A run in the registry of live runs on this host goes back to its room
        as that room's active run (:meth:`Dispatcher.adopt`), before the room's
        waiting messages, which become its follow-up batch. Otherwise its
        notice is recorded with its outcome in one transaction; it goes out
        once a transport is connected.
        """
        prefix = self.settings.commands.prefix
        host = socket.gethostname()
        followable = (
            may_follow
            and entry is not None
            and entry.live.host == host
            and self.settings.room(run.room) is not None
            # No journal: the run ended here but its end could not be recorded.
            and journal_exists(entry.live)
        )
        # Also for a run not followed: its notice goes where the run was asked.
        messages = await self.store.messages(run.message_ids)
        if followable and entry is not None and messages:
            batch = Batch(run.room, tuple(messages))
            self.dispatcher.adopt(batch, self.executor.reattach(entry, run.started_at))
            log.info("run %s in %s: reattaching to its supervisor", run.id, run.room)
            self.adopted.add(run.id)
            return True
        # Not to be followed (no registry entry, no journal, its room gone):
        # its supervisor, if still there, is asked to stop and waited for;
        # then the run's cgroup and the marker sweep (runner/recovery.py).
        killed = await recover_run(run.id, self.settings.runner.cgroup_root)
        if never_started and not killed:
            # Its start was recorded, and then its process died before it spawned
            # anything: its messages never ran, and run now as if it never began.
            # One transaction: a failure between ending it and re-queueing its
            # messages would leave them failed, and nothing to say so.
            await self.store.finish_run(
                RunEnding(
                    run.id,
                    RunReport(RunStatus.INTERRUPTED, error="stopped before claude was started"),
                    time.time(),
                    requeue=True,
                )
            )
            log.warning(
                "run %s in %s never started; its %d message(s) wait to run again",
                run.id, run.room, len(run.message_ids),
            )  # fmt: skip
            return False
        text, error = interruption_text(run, self.settings.cluster.replica_id, prefix)
        notice = (
            in_conversation(Batch(run.room, tuple(messages)), text, ReplyKind.NOTICE)
            if messages
            else Reply(run.room, text, ReplyKind.NOTICE, thread=run.room.thread or None)
        )
        await self.store.finish_run(
            RunEnding(run.id, RunReport(RunStatus.INTERRUPTED, error=error), time.time(), [notice])
        )
        # Its waiting tool requests can no longer be answered: out of `!status` and
        # out of reach of an `!approve` meant for a live run (shown once connected).
        self.closed(await self.approvals.cancel_run(run.id, RunStatus.INTERRUPTED.value))
        log.warning(
            "run %s in %s was interrupted (killed %d process(es))", run.id, run.room, killed
        )
        if entry is not None and entry.live.host == host:
            remove_run_dir(entry.live.run_dir)  # (another host's is not ours to touch)
        return False


async def _owned_elsewhere(cluster: Cluster, room: RoomKey) -> bool:
    found = await cluster.leases.lease(room)
    return found is not None and found[1] and found[0].owner != cluster.replica_id

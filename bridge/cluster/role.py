"""What holding a lease means for the service's parts (docs/replicas.md).

:class:`~bridge.cluster.replica.Cluster` decides which conversations this replica
owns; this module acts on it: a conversation taken is recovered as a restart
recovers (its runs, its waiting messages, its undelivered answers), one lost
is let go (its run interrupted, its queue forgotten, still pending for the new
owner), a message accepted for another replica's conversation is handed to
that replica, and one handed here is taken in.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bridge.cluster.replica import Cluster, Notice, pid_alive
from bridge.config import Settings
from bridge.core.model import (
    Batch,
    ExternalMessageId,
    Message,
    MessageId,
    RoomKey,
    RunReport,
    RunStatus,
    UserId,
)
from bridge.core.transport import ApprovalAction, ApprovalChoice
from bridge.inbound.commands import thread_line
from bridge.inbound.intake import Intake
from bridge.metrics import Metrics
from bridge.outbound.outbox import Outbox
from bridge.runs.stale_runs import never_started
from bridge.store.base import (
    Approval,
    LiveRunStore,
    MessageStore,
    OutboxStore,
    RegisteredRun,
    RunEnding,
    RunRecord,
    RunStore,
    StoreError,
)
from bridge.store.cluster import Leases
from dispatcher import DispatchedRun, Dispatcher, RoomStatus

log = logging.getLogger(__name__)

HARD_LIMIT_MARGIN_S = 10.0
"""Beyond a run's time limit and stop grace: its supervisor's kill phase, and clock skew."""


class StopThreads(Protocol):
    """:meth:`bridge.inbound.commands.CommandHandler.stop_threads`."""

    async def __call__(
        self, room: RoomKey, actor: UserId, *, before: MessageId | None = None
    ) -> tuple[int, list[Message], bool]: ...


class RecoverRun(Protocol):
    """The service's recovery of one run: reattach it (True) if ``may_follow``, else stop
    it on this host and report it interrupted, or run its messages again if it
    ``never_started`` (False)."""

    async def __call__(
        self,
        run: RunRecord,
        entry: RegisteredRun | None,
        may_follow: bool,
        *,
        never_started: bool = False,
    ) -> bool: ...


async def _nothing_decided(room: RoomKey, number: int) -> None:
    pass


class ClusterRoleStore(MessageStore, RunStore, LiveRunStore, OutboxStore, Protocol):
    """The store's roles :class:`ClusterRole` uses."""


@dataclass(slots=True)
class ClusterRole:
    settings: Settings
    cluster: Cluster
    leases: Leases
    store: ClusterRoleStore
    dispatcher: Dispatcher
    intake: Callable[[], Intake]
    """The intake, built after the role (it places messages through the role)."""
    outbox: Outbox
    metrics: Metrics
    recover_run: RecoverRun
    on_approval_action: Callable[[ApprovalAction], Awaitable[object]]
    on_decided: Callable[[RoomKey, int], Awaitable[None]] = _nothing_decided
    """Tells claude a decision another replica recorded for a request of a run here."""
    taken: Callable[[], None] = lambda: None
    """Told after a takeover (the usage-limit retries look again)."""
    stop_threads: StopThreads | None = None
    """Stops a room's threads this replica runs (a top-level ``!stop`` heard elsewhere)."""

    # -- Placement (bridge.inbound.intake) --

    async def local(self, message: Message, *, needs_slot: bool = False) -> bool:
        """Handle ``message`` here if this replica owns its conversation, or can take it
        (with a free run slot, when it is for a run); otherwise tell its owner, or,
        if nobody owns it, every replica: one with a free slot takes it."""
        owner = await self.cluster.place(message.room, need_slot=needs_slot)
        if owner is None:
            return True
        self.metrics.forwarded.labels("message").inc()
        await self.cluster.tell(
            owner, "message" if owner else "work", message.room, {"id": message.id}
        )
        return False

    async def forward_action(self, action: ApprovalAction, room: RoomKey) -> None:
        """A click on another replica's request: for that replica (the poll cannot find it)."""
        owner = await self.cluster.place(room, need_slot=False)
        if owner is None:
            # Taken here meanwhile (its owner died): its run is gone, the desk says so.
            await self.on_approval_action(action)
            return
        self.metrics.forwarded.labels("action").inc()
        body = {
            "sender": action.sender,
            "message": action.message_id,
            "choice": action.choice,
            "answer": action.answer,
            "guide": action.guide,
        }
        await self.cluster.tell(owner, "action", action.room, body)

    async def hand_over_decision(self, approval: Approval) -> None:
        """A decision recorded here (the web console) on a request of a conversation
        another replica runs: for that replica, which tells claude."""
        owner = await self.cluster.place(approval.room, need_slot=False)
        if owner is None:
            # Taken here meanwhile (its owner died): its run is gone, or reattached here.
            await self.on_decided(approval.room, approval.number)
            return
        self.metrics.forwarded.labels("decision").inc()
        await self.cluster.tell(owner, "decided", approval.room, {"number": approval.number})

    async def changed(self, message: Message, *, deleted: bool) -> None:
        owner = await self.cluster.place(message.room, need_slot=False)
        if owner is None:
            # Ours after all: taken just now, maybe by a takeover this call waited
            # for, whose recovery may have read the message before the change was
            # recorded (and queued it as it was then). The queue follows now; no
            # effect if it read the change, or if the message is not queued.
            if deleted:
                self.dispatcher.remove(message)
            else:
                self.dispatcher.replace(message)
            return
        if owner:
            kind = "deleted" if deleted else "edited"
            await self.cluster.tell(owner, kind, message.room, {"id": message.id})

    # -- RoomWideElsewhere (bridge.inbound.commands): top-level !stop / !status in thread rooms --

    async def threads(self, room: RoomKey) -> list[str]:
        """The room's threads with work (a run, a waiting message) other replicas own:
        a thread's lease outlives its work (and each top-level message opens one).
        And those with messages waiting that no replica owns: left in the inbox for
        want of a run slot (placement), as a single process says of them."""
        pending = [m.room for m in await self.store.pending_messages()]
        busy = {run.room for run in await self.store.running_runs()}
        busy.update(pending)
        lines = []
        held = set()
        for lease, live in await self.leases.leases():
            if live:
                held.add(lease.room)
            theirs = live and lease.owner != self.cluster.replica_id and lease.room in busy
            if theirs and lease.room.thread and lease.room.channel == room.channel:
                lines.append(f"Thread {lease.room.thread}: on replica {lease.owner}.")
        waiting = Counter(
            key
            for key in pending
            if key.thread and key.channel == room.channel and key != room and key not in held
        )
        for key, count in waiting.items():
            lines.append(thread_line(key.thread, RoomStatus(waiting=count, waiting_for_slot=True)))
        return lines

    async def stop(self, room: RoomKey, actor: UserId, before: MessageId) -> int | None:
        """Drop what waits unowned in ``room``'s threads (accepted before the stop,
        message ``before``), then tell every replica to stop the threads it runs.
        How many were dropped; None if the database failed (they wait on)."""
        dropped: int | None
        try:
            # Before the notice: a replica stopping its runs frees a slot, and its
            # poll would take such a thread and run what waits in it.
            dropped = await self.leases.drop_unowned_threads(
                room.channel, before, actor, time.time()
            )
        except StoreError:
            log.exception("could not drop the messages waiting unowned in %s's threads", room)
            dropped = None
        # ``before``: a replica hearing it late (after a takeover in its poll,
        # say) must spare what it received after the stop.
        body = {"actor": actor, "from": self.cluster.replica_id, "before": before}
        await self.cluster.tell("", "room-stop", room.channel, body)
        return dropped

    # -- Cluster's callbacks --

    async def heard(self, notice: Notice) -> None:
        if notice.kind == "message":
            found = await self.store.messages([MessageId(int(notice.body["id"]))])
            for message in found:
                if self.cluster.holds(message.room):
                    await self.intake().take_forwarded(message)
                else:
                    # Not (or no longer) ours: place it again (take it, or pass it on).
                    await self.intake_again(message)
        elif notice.kind in ("edited", "deleted"):
            for message in await self.store.messages([MessageId(int(notice.body["id"]))]):
                if notice.kind == "deleted":
                    self.dispatcher.remove(message)
                else:
                    self.dispatcher.replace(message)
        elif notice.kind == "room-stop" and self.stop_threads is not None:
            if notice.body.get("from") == self.cluster.replica_id:
                # Heard by the replica that asked too: it stopped its own threads
                # already, and what it queued since came after the stop.
                return
            # Messages sent after the `!stop` may be queued here by now: they stay.
            # (No cut-off from a replica of an older version: all is stopped.)
            before = notice.body.get("before")
            runs, dropped, _ = await self.stop_threads(
                notice.room,
                UserId(str(notice.body["actor"])),
                before=None if before is None else MessageId(int(before)),
            )
            if runs or dropped:
                log.info(
                    "stopped %d run(s) and dropped %d message(s) of %s's threads, as asked",
                    runs, len(dropped), notice.room,
                )  # fmt: skip
        elif notice.kind == "decided":
            await self.on_decided(notice.room, int(notice.body["number"]))
        elif notice.kind == "action":
            action = ApprovalAction(
                notice.room,
                UserId(str(notice.body["sender"])),
                ExternalMessageId(str(notice.body["message"])),
                ApprovalChoice(str(notice.body["choice"])),
                str(notice.body.get("answer") or ""),
                notice.body.get("guide") is True,
            )
            await self.on_approval_action(action)

    async def intake_again(self, message: Message) -> None:
        if await self.local(message):
            await self.intake().take_forwarded(message)

    async def take_over(self, room: RoomKey) -> None:
        """Recover ``room`` as a restart would, now that this replica owns it."""
        registered = {e.live.run_id: e for e in await self.store.live_runs() if e.room == room}
        for run in await self.store.running_runs():
            if run.room != room:
                continue
            entry = registered.get(run.id)
            here = socket.gethostname()
            mine = run.replica in (None, self.cluster.replica_id)
            # The replica that started it, read once: where it ran, whether it lives.
            other = None if mine else await self.leases.previous(run.replica or "")
            host = _host_of(entry, here if mine else None if other is None else other.host)
            if host == here:
                # Its supervisor is reachable here. Followed (its answer, if claude
                # gave one, is in its journal) when its replica is this one or is
                # gone; stopped when that replica still lives (paused, or cut off:
                # it would hold on to the run). A pid reused since counts as alive:
                # the run is then stopped, the safe side.
                alive = other is not None and (other.host != here or pid_alive(other.pid))
                if mine:
                    state_dir: Path | None = self.settings.runner.state_dir
                else:
                    state_dir = (
                        None if other is None or other.state_dir is None else Path(other.state_dir)
                    )
                never = state_dir is not None and never_started(run, entry, state_dir)
                await self.recover_run(run, entry, mine or not alive, never_started=never)
            else:
                await self._wait_out(run, host)
        await self.intake().recover(await self.store.pending_messages(room), keep_commands=True)
        self.outbox.submit(await self.store.undelivered(room))
        self.taken()

    def give_up(self, room: RoomKey) -> None:
        """Another replica owns ``room`` now: nothing of it goes on here."""
        left = self.dispatcher.release(room)
        if left:
            log.info("%d waiting message(s) of %s are left to its new owner", len(left), room)

    async def recheck(self) -> None:
        """The poll's fallback, in the conversations this replica owns: messages pending
        for a while and not in its dispatcher's hands (a lost notification), and
        answers recorded for them by a replica that had lost them (its last words
        on a run it was made to give up). One read of each, whatever the count."""
        if not self.cluster.owned():
            return
        since = time.time() - 2 * self.settings.cluster.poll_s
        for message in await self.store.pending_messages():
            if (
                message.received_at < since
                and self.cluster.holds(message.room)
                and not self.dispatcher.holds(message)
            ):
                await self.intake().take_forwarded(message)
        entries = await self.store.undelivered()
        self.outbox.submit(e for e in entries if self.cluster.holds(e.reply.room))

    # -- helpers --

    async def _wait_out(self, run: RunRecord, host: str | None) -> None:
        """A run on another host (or an unknown one) cannot be stopped from here: the
        conversation waits until the run has ended, or its hard time limit has passed
        (its supervisor enforces it on its own), then reports it interrupted."""
        messages = await self.store.messages(run.message_ids)
        if not messages:
            return
        room_settings = self.settings.room(run.room)
        limit = 0.0 if room_settings is None else room_settings.run_timeout_s
        deadline = run.started_at + limit + self.settings.runner.stop_grace_s + HARD_LIMIT_MARGIN_S
        log.warning(
            "run %s in %s is on %s: its conversation waits for it to end (at the latest %.0fs)",
            run.id, run.room, host or "an unknown host", max(0.0, deadline - time.time()),
        )  # fmt: skip

        async def wait(_run: DispatchedRun) -> None:
            while time.time() < deadline:
                record = await self.store.get_run(run.id)
                if record is None or record.status is not RunStatus.RUNNING:
                    return
                await asyncio.sleep(self.settings.cluster.poll_s)
            report = RunReport(
                RunStatus.INTERRUPTED, error="its replica was lost; it ran past its time limit"
            )
            await self.store.finish_run(RunEnding(run.id, report, time.time()))

        self.dispatcher.adopt(Batch(run.room, tuple(messages)), wait)


def _host_of(entry: RegisteredRun | None, started_on: str | None) -> str | None:
    """Where a run's processes are, if anyone can tell: its registry entry's host, else
    the host of the replica that started it (``started_on``; this one's for its own
    runs and for runs of a single process from before replicas)."""
    return entry.live.host if entry is not None else started_on


__all__ = ["ClusterRole"]

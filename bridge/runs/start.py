"""A run's start: its record (retried, waiting for a cluster slot), a start that never
went through, and what a reattached run was promised before a restart.

:class:`RunStart` is the part of :class:`~bridge.runs.executor.RunExecutor` for it
(docs/replicas.md, "Replicas and leases"; docs/live-runs.md, "Messages during a run").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from bridge.core.model import Batch, Message, RoomKey, RunId, RunReport, RunStatus
from bridge.outbound.notices import Notices
from bridge.runs.lifecycle import AbandonStart, Action, GiveUp
from bridge.runs.prestarts import Taken
from bridge.runs.prompt import build_prompt
from bridge.runs.running import Live, Run, give_up, steer_uuid
from bridge.store.base import (
    STEERED,
    AuditAction,
    AuditFilter,
    Fence,
    RunEnding,
    RunLifecycleStore,
    StoreError,
)
from bridge.store.cluster import ClusterFull, Fenced
from runner.control import InputClosed

# The executor's parts log under its name (its log is one story per run).
log = logging.getLogger("bridge.runs.executor").getChild("start")

CLUSTER_FULL_RETRY_S = 1.0
"""How often a start waiting for a cluster slot tries again (``[cluster] max_concurrent_runs``)."""


START_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
"""Pauses between tries of a failing ``start_run`` (about a minute in all)."""


class RunStart:
    """The start of a run (a part of :class:`RunExecutor`; the fields it names are
    the executor's that it uses)."""

    store: RunLifecycleStore
    notices: Notices
    wall_clock: Callable[[], float]
    start_retry_delays_s: tuple[float, ...]
    fence_of: Callable[[RoomKey], Fence | None]

    async def _start(self, run_id: RunId, batch: Batch, started: float) -> bool:
        """Record the run's start, retrying in order; False if the store kept failing.

        The batch keeps its room while this retries, so no newer message of
        the room can run before it.
        """
        delays = iter(self.start_retry_delays_s)
        told: set[str] = set()

        async def tell_once(text: str) -> None:
            """Say why the run waits, once per reason however long it retries."""
            if text not in told:
                told.add(text)
                await self.notices.say(batch.room, text, about=batch)

        while True:
            try:
                await self.store.start_run(run_id, batch, started, self.fence_of(batch.room))
            except Fenced:
                # Another replica holds the conversation now: its messages are
                # still pending, and the new owner runs them.
                log.warning("run %s not started: %s moved to another replica", run_id, batch.room)
                return False
            except ClusterFull:
                # Not a failure: the batch keeps its place until a run ends somewhere.
                await tell_once(
                    "Every run slot of the cluster is busy; this run starts when one frees."
                )
                await asyncio.sleep(CLUSTER_FULL_RETRY_S)
                continue
            except StoreError:
                delay = next(delays, None)
                if delay is None:
                    break
                log.warning("could not record the start of a run; trying again in %gs", delay)
            else:
                return True
            await tell_once("The database is failing; the run starts as soon as it answers again.")
            await asyncio.sleep(delay)
        # Nothing was recorded: the messages are still pending in the store and
        # run at the next start, in the order they were accepted.
        log.error("could not record the start of a run; its messages run after a restart")
        await self.notices.say(
            batch.room,
            "Could not start the run: the database kept failing. Your messages are kept"
            " and run when chatbridge restarts.",
            about=batch,
        )
        return False

    async def _unstarted(
        self, run_id: RunId, batch: Batch, taken: Taken | None, action: Action
    ) -> None:
        """The ending of a run whose start never went through."""
        match action:
            case GiveUp(why=why):
                await give_up(taken, why)
            case AbandonStart(status=status):
                await self._cancelled_at_start(run_id, batch, taken, status)
            case _:
                pass

    async def _cancelled_at_start(
        self, run_id: RunId, batch: Batch, taken: Taken | None, status: RunStatus
    ) -> None:
        await give_up(taken, "dropped" if status is RunStatus.STOPPED else "shutdown")
        if await self.store.get_run(run_id) is not None:
            await self.store.finish_run(RunEnding(run_id, RunReport(status), self.wall_clock()))
        elif status is RunStatus.STOPPED:
            await self.store.mark_dropped(batch.ids, None, self.wall_clock())

    async def _steered_into(self, run_id: RunId, batch: Batch) -> list[Batch]:
        """The batches recorded as steered into a run a previous process followed (by
        the audit trail: one steer's rows share their time), in order."""
        try:
            trail = await self.store.audit_trail(AuditFilter(run_id=run_id))
        except StoreError:
            log.warning("could not read which messages were steered into the run")
            return []
        steers: dict[float, list[Message]] = {}
        by_id = {m.id: m for m in batch.messages}
        for row in trail:
            if (
                row.action is AuditAction.MESSAGE_DISPATCHED
                and row.detail == STEERED
                and row.message_id in by_id
            ):
                steers.setdefault(row.at, []).append(by_id[row.message_id])
        return [Batch(batch.room, tuple(messages)) for messages in steers.values()]

    async def _steer_unsent(self, run: Run, live: Live, steered: list[Batch]) -> None:
        """A reattached run's steered batches, promised to it until the journal's history
        is read: one the previous process recorded and died before writing into claude
        (record, then send) is written now; if the run takes no more input, the room is
        told that claude never saw it."""
        control = live.control
        await control.attached()
        for batch in steered:
            uid = steer_uuid(run.id, batch)
            if control.sent(uid):
                control.withdraw(uid)  # written before the restart
            else:
                try:
                    control.send(build_prompt(batch), uid)
                except InputClosed:
                    control.withdraw(uid)
                    log.warning("a message recorded into the run never reached claude")
                    which = "Your messages" if len(batch.messages) > 1 else "Your message"
                    await self.notices.say(
                        batch.room,
                        f"{which} did not reach claude: chatbridge stopped as it was added"
                        f" to run `{run.id}`, which ended without it. Please send it again.",
                        about=batch,
                    )
                    continue
                log.info("%d recorded message(s) written into the run after the restart",
                         len(batch.messages))  # fmt: skip
            live.steered.append(batch)

    async def _reset_since(self, room: RoomKey, started: float) -> bool:
        """Whether the room's session was reset since ``started`` (by the audit trail: a
        process before this one may have answered the ``!reset``)."""
        try:
            trail = await self.store.audit_trail(AuditFilter(room=room))
        except StoreError:
            return False
        return any(a.action is AuditAction.SESSION_RESET and a.at >= started for a in trail)

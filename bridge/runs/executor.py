"""Executes one batch: record the run, drive claude, report back, record the outcome.

The dispatcher calls :meth:`RunExecutor.execute` in a task it owns and cancels it to stop
the run; the run is recorded as the dispatcher says it ended (stopped or interrupted).
Each run's phases are its lifecycle's (bridge/runs/lifecycle.py), whose one ending action
per run the executor carries out. Its parts, by phase: the start (``start``), the request
(``request``), the events while claude runs (``events``), the ending (``ending``) and what
the room sees beside the answer (``cosmetics``). Whatever fails, the run ends with one
outcome and the room is free for its next batch (docs/live-runs.md, "A run's lifecycle";
docs/operations.md, "Answers and rate limits"; docs/replicas.md, "Replicas and leases").
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from bridge.config import Settings
from bridge.core import stages
from bridge.core.aio import shielded
from bridge.core.model import RoomKey, RunId, RunReport, RunStatus
from bridge.host.logs import log_context
from bridge.host.worktrees import in_worktree
from bridge.live.approval_flow import ApprovalFlow
from bridge.live.registry import LiveRuns
from bridge.metrics import Metrics
from bridge.outbound.notices import Notices
from bridge.outbound.outbox import Outbox
from bridge.outbound.replies import Replier
from bridge.runs.cosmetics import COSMETIC_TIMEOUT_S, PROGRESS_FINISH_TIMEOUT_S, TYPING_AFTER_S
from bridge.runs.events import RunEvents
from bridge.runs.file_posts import FilePosts
from bridge.runs.lifecycle import (
    DriveCancelled,
    DriveEnded,
    End,
    Retried,
    StartRecorded,
    StartRefused,
    reattached,
)
from bridge.runs.prestarts import Prestarts, Taken
from bridge.runs.request import RunRequests, kept_transcripts, run_request
from bridge.runs.running import STORE_RETRY_DELAYS_S, Live, Run, give_up, steer_uuid
from bridge.runs.start import START_RETRY_DELAYS_S, RunStart
from bridge.runs.transcripts import Transcripts
from bridge.runs.usage import LimitResumes
from bridge.store.base import Fence, RegisteredRun, Store
from dispatcher import DispatchedRun, Execute
from runner import Prestarted, RunRequest, Spares, attach_claude, run_claude, run_dir_made
from runner.control import RunControl

log = logging.getLogger(__name__)


def new_run_id() -> RunId:
    return RunId(f"run-{secrets.token_hex(8)}")


def unfenced(room: RoomKey) -> None:
    """A run's start alone: under no replica's claim."""


def held_alone(room: RoomKey) -> bool:
    """Alone, this process owns every room."""
    return True


@dataclass(slots=True)
class RunExecutor(RunStart, RunEvents):
    """Runs batches for the dispatcher: one :meth:`execute` call per run."""

    settings: Settings
    store: Store
    replier: Replier
    metrics: Metrics
    outbox: Outbox
    notices: Notices
    wall_clock: Callable[[], float] = time.time
    progress_interval_s: float = 2.0
    store_retry_delays_s: tuple[float, ...] = STORE_RETRY_DELAYS_S
    start_retry_delays_s: tuple[float, ...] = START_RETRY_DELAYS_S
    cosmetic_timeout_s: float = COSMETIC_TIMEOUT_S
    typing_after_s: float = TYPING_AFTER_S
    progress_finish_timeout_s: float = PROGRESS_FINISH_TIMEOUT_S
    live_runs: LiveRuns = field(default_factory=LiveRuns)
    """The runs going on now, by room (commands, buttons and steering reach them)."""
    approvals: ApprovalFlow | None = None
    """Asks the room about tool uses (``approve_tools``); None: requests are not asked."""
    prestarts: Prestarts | None = None
    """Claudes started while their batch gathered (``[runner] prestart``)."""
    spares: Spares | None = None
    """Supervisors started ahead of their runs (runner/spare.py); None: each run starts its own."""
    limits: LimitResumes | None = None
    """Tells the room about usage limits and retries after them; None: a plain failure."""
    file_posts: FilePosts | None = None
    """Posts the files claude sends with ``send_file`` (docs/files.md); None: not posted."""
    fence_of: Callable[[RoomKey], Fence | None] = unfenced
    """The replica's claim a run's start is recorded under (docs/replicas.md); None alone."""
    holds: Callable[[RoomKey], bool] = held_alone
    """Whether this replica owns the room now (docs/replicas.md); alone, always."""
    transcripts: Transcripts | None = None
    """Carries sessions between replicas through the database (docs/replicas-sessions.md);
    None: made from ``[runner] transcripts_in_db`` (off: sessions stay on this host)."""
    requests: RunRequests = field(kw_only=True)
    """Builds the runs' requests (the prestarts' too)."""
    _finishing: set[asyncio.Task[None]] = field(default_factory=set)
    """The progress messages' last edits still under way (see :meth:`drain`)."""
    _generations: dict[RoomKey, int] = field(default_factory=dict)
    """Bumped by ``!reset``: a run that began before keeps its session to itself."""

    def __post_init__(self) -> None:
        if self.transcripts is None:
            self.transcripts = kept_transcripts(self.settings, self.store, self.wall_clock)

    async def reset_session(self, room: RoomKey) -> None:
        """Forget the room's Claude session, also for the run active now, and a ``!fork``
        of it not yet used (it would fork whatever session comes next)."""
        self._generations[room] = self._generations.get(room, 0) + 1
        await self.store.set_session(room, None)
        await self.store.set_room_fork(room, False)

    async def execute(self, dispatched: DispatchedRun) -> None:
        """The dispatcher's ``execute``: it never calls this while shutting down."""
        # The room's prestart whether or not the dispatcher announced one
        # (``dispatched.prestarted``): a claude kept warm since the room's last run is
        # the room's too, and left beside this run it would be a second claude of the
        # session. ``Taken.prestarted`` checks it still fits the request.
        taken = self.prestarts.take(dispatched.batch.room) if self.prestarts is not None else None
        run_id = taken.run_id if taken is not None else new_run_id()
        live = Live(dispatched)
        # Set before the first await: a steer batch may come due at any time.
        generation = self._generations.get(dispatched.batch.room, 0)
        dispatched.steer = self._steer_hook(run_id, live, generation)
        with log_context(room=dispatched.batch.room, run=run_id):
            await self._execute(run_id, dispatched, live, taken, generation)

    async def _execute(
        self,
        run_id: RunId,
        dispatched: DispatchedRun,
        live: Live,
        taken: Taken | None,
        generation: int,
    ) -> None:
        stages.stamp("dispatched")
        batch = dispatched.batch
        started = self.wall_clock()
        # Read beside the start's commit (a reader beside the writer): the request,
        # claude's prompt, needs it next.
        live.room_state = asyncio.create_task(
            self.store.room_state(batch.room), name=f"room state {run_id}"
        )
        try:
            try:
                recorded = await self._start(run_id, batch, started)
            except asyncio.CancelledError:
                live.stopping()
                for action in live.feed(DriveCancelled()):
                    await self._settle(self._unstarted(run_id, batch, taken, action))
                raise
            if not recorded:
                for action in live.feed(StartRefused()):
                    await self._settle(self._unstarted(run_id, batch, taken, action))
                return
            live.feed(StartRecorded())
            stages.stamp("start_recorded")
            self.metrics.runs_started.inc()
            if len(batch.messages) > 1:
                self.metrics.coalesced.inc(len(batch.messages))
            run = Run(run_id, batch, started, generation, self._progress(batch))
            await self._follow(run, live, dispatched, self._drive(run, live, taken))
        finally:
            # Taken by the request by now, unless the run ended before it.
            live.room_state.cancel()
            await asyncio.gather(live.room_state, return_exceptions=True)

    def reattach(self, entry: RegisteredRun, started: float) -> Execute:
        """The dispatcher's ``execute`` for a run a previous process started and left
        running (see :meth:`Dispatcher.adopt`): attach to its supervisor and carry on.

        The journal is replayed from its start (the session, the answer), but
        tool uses the room was already shown are not shown again.
        """
        run_id = entry.live.run_id

        async def execute(dispatched: DispatchedRun) -> None:
            batch = dispatched.batch
            with log_context(room=batch.room, run=run_id):
                room = self.settings.room(batch.room)
                if room is None:
                    raise RuntimeError(f"room {batch.room} is not configured")
                generation = self._generations.get(batch.room, 0)
                if await self._reset_since(batch.room, started):
                    # A !reset answered before the restart: the run's session is
                    # not to become the room's (a generation before the current).
                    generation -= 1
                run = Run(run_id, batch, started, generation, self._progress(batch, started))
                live = Live(
                    dispatched,
                    shown=entry.delivered_offset,
                    supervisor=entry.live,
                    state=reattached(),
                )
                dispatched.steer = self._steer_hook(run_id, live, generation)
                log.info("reattaching to the run (journal shown up to %d)", entry.delivered_offset)
                steered = await self._steered_into(run_id, batch)
                for into in steered:
                    live.control.promise(steer_uuid(run_id, into))
                if steered:
                    live.beside(
                        asyncio.create_task(
                            self._steer_unsent(run, live, steered), name=f"unsent {run_id}"
                        )
                    )
                request = run_request(
                    self.settings, in_worktree(batch.room, room), run_id, "", None
                )
                drive = attach_claude(
                    request,
                    entry.live,
                    self._on_event(run, live),
                    on_position=live.at,
                    detach=live.detach,
                    control=live.control,
                )
                await self._follow(run, live, dispatched, drive)

        return execute

    async def _follow(
        self,
        run: Run,
        live: Live,
        dispatched: DispatchedRun,
        drive: Coroutine[Any, Any, RunReport],
    ) -> None:
        """Drive the run to its ending, and end it there (:meth:`_end`), once."""
        try:
            report = await drive
        except asyncio.CancelledError:
            # The runner has stopped claude by now (or left it to its supervisor).
            live.stopping()
            cancelled = DriveCancelled(
                holds=self.holds(run.batch.room),
                dir_made=run_dir_made(self.settings.runner.state_dir, run.id),
            )
            for action in live.feed(cancelled):
                await self._settle(self._end(run, live, action, None))
            raise
        except Exception as exc:
            log.exception("the run failed inside chatbridge")
            report = RunReport(
                RunStatus.FAILED, error=f"internal error ({type(exc).__name__}); see the log"
            )
        actions = live.feed(DriveEnded(not_started=report.not_started))
        for action in actions:
            # A !stop landing while the end is reported must not cut the answer off.
            await self._settle(self._end(run, live, action, report))
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Cancelled after claude had printed its result: run_claude stopped
            # the run and returned the answer instead of raising, and the
            # answer is now recorded. The cancellation still propagates.
            raise asyncio.CancelledError
        if any(isinstance(action, End) for action in actions):
            self._keep_warm(run.batch.room, report)

    async def _drive(self, run: Run, live: Live, taken: Taken | None) -> RunReport:
        """Run claude (again without the session if claude lost it); its last report."""
        batch = run.batch
        try:
            prepared = await self.requests.prepare(run, taken, live.room_state)
        except BaseException as exc:
            # Ended before it reached claude (a !stop, a store that kept failing):
            # a claude started for it (prestarted, or kept warm) goes with it, or
            # it would run on past the run, beside the room's next one.
            why = "dropped" if isinstance(exc, asyncio.CancelledError) else "failed"
            await shielded(give_up(taken, why))
            raise
        if isinstance(prepared, RunReport):
            return prepared
        request, prestarted = prepared
        room = self.settings.room(batch.room)
        if room is not None and room.summarize_changes and live.baseline is None:
            # Before claude has the prompt: nothing of the run has touched the files yet.
            live.baseline = await self._baseline(request.cwd)
        session = request.session_id
        on_event = self._on_event(run, live)

        def attempt(request: RunRequest, prestarted: Prestarted | None) -> Awaitable[RunReport]:
            return run_claude(
                request,
                on_event,
                on_position=live.at,
                detach=live.detach,
                control=live.control,
                prestarted=prestarted,
                may_start=lambda: self.holds(batch.room),
                spares=self.spares,
            )

        try:
            report = await attempt(request, prestarted)
        except BaseException:
            if prestarted is not None:
                # Cancelled before the run took it (a no-op once it did): it goes too.
                await shielded(prestarted.cancel())
            raise
        if report.session_not_found and session is not None and live.answer is None:
            await self.notices.say(
                batch.room,
                f"Claude no longer has session `{session}`; continuing in a new session.",
                about=batch,
            )
            await self.store.set_session(batch.room, None)
            # The same run id, so the same run directory: the first try's journal goes,
            # and its registration (the registry's row, claude's pid) with it. Should the
            # second try not start (the room moved meanwhile), the new owner then finds a
            # run that never began, and runs its messages.
            self._remove_journal(live)
            # No claude has the prompt now, before the wait below: cancelled during it
            # (the room moved), the run is the new owner's to run, not recorded here.
            live.feed(Retried())
            first, live.registered = live.registered, None
            await shielded(self._unregister(run.id, first))
            live.control = RunControl()
            # The first try's result (zeroed: no session) says nothing of this one's cost.
            live.result = None
            report = await attempt(replace(request, session_id=None), None)
        return report

    async def _settle(self, work: Coroutine[Any, Any, None]) -> None:
        """Finish ``work`` whatever happens to this task; a failure is logged, not raised."""
        try:
            await shielded(work)
        except Exception:
            # A bug at the end of a run must not leave the room busy forever.
            log.exception("the end of the run failed inside chatbridge")

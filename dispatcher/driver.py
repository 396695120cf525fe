"""The asyncio shell around :class:`~dispatcher.scheduler.Scheduler`.

It owns one task per active run (in a TaskGroup) and a single clock
callback for all rooms, armed for the scheduler's earliest deadline. Timer
callbacks and run ends feed the scheduler synchronously, so with a
:class:`~dispatcher.clock.ManualClock` the dispatcher has fully reacted to a
deadline when ``advance`` returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from bridge.core.model import Batch, Message, RoomKey
from dispatcher.clock import Clock, MonotonicClock, TimerHandle
from dispatcher.limits import DispatchLimits
from dispatcher.scheduler import Scheduler
from dispatcher.status import RoomStatus, StopResult

logger = logging.getLogger(__name__)

Execute = Callable[[Batch], Awaitable[None]]
"""Carries out one run of a batch; cancelled when the room is stopped."""


class _Run:
    """The driver's handle on one run."""

    __slots__ = ("batch", "executing", "skip", "task")

    task: asyncio.Task[None]
    """Set right after construction: the task needs the run to exist first."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.executing = False
        """``execute`` was called: cancelling the task now reaches its cleanup."""
        self.skip = False
        """Stopped before ``execute`` was called: never call it."""


class Dispatcher:
    """Decides when each room's messages go to a run, and starts the runs.

    Messages may be submitted before :meth:`serve` runs; they wait (and
    their windows close) until it does, then ready rooms start in order.
    """

    def __init__(
        self, limits: DispatchLimits, execute: Execute, clock: Clock | None = None
    ) -> None:
        self._limits = limits
        self._execute = execute
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        # No slots until serve() opens them: a run needs the task group.
        self._scheduler = Scheduler(limits, capacity=0)
        self._runs: dict[RoomKey, _Run] = {}
        self._group: asyncio.TaskGroup | None = None
        self._timer: TimerHandle | None = None
        self._timer_at: float | None = None
        self._fault: asyncio.Future[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    # -- public API ----------------------------------------------------------

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        """Run the dispatcher until cancelled; set ``ready`` once runs can start.

        On cancellation no new run starts; active runs are cancelled and
        awaited (their cleanup is theirs), then ``CancelledError`` propagates.
        Runs that had not called ``execute`` yet never will: their messages
        are still pending as far as the service is concerned.
        """
        if self._group is not None:
            raise RuntimeError("the dispatcher is already serving")
        self._fault = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                now = self._clock.now()
                started = self._scheduler.set_capacity(self._limits.max_concurrent_runs, now)
                # Deadlines that passed before serving (recovered messages).
                started += self._scheduler.fire_timers(now)
                self._after(started)
                if ready is not None:
                    ready.set()
                try:
                    await self._fault  # only an internal error completes it
                finally:
                    # Stop granting before the group cancels the runs, so runs
                    # that end during shutdown do not start queued batches.
                    self._scheduler.set_capacity(0, self._clock.now())
        finally:
            self._group = None
            self._fault = None
            self._disarm()
            # A run cancelled before its first step never reported its end.
            for run in list(self._runs.values()):
                self._finish(run)

    def submit(self, message: Message) -> None:
        """Hand a stored message to its room. Never blocks.

        Re-submitting accepted messages (``!retry``) is the same call.
        """
        self._after(self._scheduler.submit(message, self._clock.now()))

    def stop(self, room: RoomKey) -> StopResult:
        """Cancel the room's active run and drop its messages not yet in a run.

        The run's ``execute`` gets ``CancelledError`` and cleans up on its
        own; until it returns the room stays busy, and messages that arrive
        meanwhile queue for the next run. A run that had not reached
        ``execute`` yet is not called at all: its messages are reported as
        dropped, not stopped. A room waiting for a slot gives up its place.
        """
        result = self._scheduler.stop(room)
        if result.stopped is not None:
            run = self._runs[room]
            if run.executing:
                run.task.cancel()
            else:
                run.skip = True
                result = StopResult(stopped=None, dropped=result.stopped.messages + result.dropped)
        self._after(())
        return result

    def status(self, room: RoomKey) -> RoomStatus:
        """What the room is doing now."""
        return self._scheduler.status(room)

    async def wait_idle(self) -> None:
        """Return once no room has pending messages, an open batch or a run."""
        await self._idle.wait()

    @property
    def active_runs(self) -> int:
        """Runs started and not yet ended (stopped ones winding down included)."""
        return self._scheduler.active_runs

    @property
    def queued(self) -> int:
        """Messages accepted but not yet in a run, across rooms."""
        return self._scheduler.queued

    @property
    def tracked_rooms(self) -> int:
        """Rooms holding any state; 0 when every room is idle."""
        return self._scheduler.room_count

    # -- internals -----------------------------------------------------------

    def _after(self, started: Iterable[Batch]) -> None:
        """Carry out what an event decided: start runs, re-arm the timer, signal idleness."""
        for batch in started:
            self._start(batch)
        self._arm()
        if self._scheduler.room_count:
            self._idle.clear()
        else:
            self._idle.set()

    def _start(self, batch: Batch) -> None:
        if self._group is None:
            raise RuntimeError("a run was granted while not serving")
        run = _Run(batch)
        self._runs[batch.room] = run
        run.task = self._group.create_task(self._run(run), name=f"dispatch {batch.room}")

    async def _run(self, run: _Run) -> None:
        try:
            if not run.skip:
                run.executing = True
                await self._execute(run.batch)
        except Exception:
            # A failed run is the run's problem, never the dispatcher's.
            logger.exception("run in room %s failed", run.batch.room)
        finally:
            self._finish(run)

    def _finish(self, run: _Run) -> None:
        if self._runs.get(run.batch.room) is not run:
            return  # already finished (shutdown reconciliation)
        del self._runs[run.batch.room]
        self._after(self._scheduler.run_finished(run.batch.room, self._clock.now()))

    def _arm(self) -> None:
        """Keep one clock callback, at the scheduler's earliest deadline, while serving."""
        at = self._scheduler.next_deadline() if self._group is not None else None
        if at == self._timer_at:
            return
        self._disarm()
        if at is not None:
            self._timer = self._clock.call_at(at, self._on_timer)
            self._timer_at = at

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = None

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        try:
            self._after(self._scheduler.fire_timers(self._clock.now()))
        except Exception as exc:
            # A clock callback has no caller to raise to: fail serve() instead
            # of leaving rooms wedged behind a half-applied event.
            if self._fault is None or self._fault.done():
                raise
            self._fault.set_exception(exc)

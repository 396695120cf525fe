"""The asyncio shell around :class:`~dispatcher.scheduler.Scheduler`.

It owns one task per active run (in a TaskGroup) and one clock callback for all rooms, and
only carries out the scheduler's decisions (runs, stops, drains, steer offers, prestarts,
adopted runs). Timers and run ends feed the scheduler synchronously, so with a
:class:`~dispatcher.clock.ManualClock` the dispatcher has fully reacted when ``advance``
returns. A steer hook that raises counts as a refusal; a failing prestarter is logged
(docs/live-runs.md, "Dispatcher (`dispatcher/`)").
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

from bridge.core.model import Batch, Message, RoomKey, UserId
from dispatcher.clock import Clock, MonotonicClock, TimerHandle
from dispatcher.lending import SlotLease
from dispatcher.limits import DispatchLimits
from dispatcher.policy import DuringRun, Prestarter
from dispatcher.room import BeginPrestart, CancelPrestart, StartRun, SteerRun
from dispatcher.scheduler import Action, Scheduler
from dispatcher.status import EndReason, Reclaimed, RoomStatus, StopResult

logger = logging.getLogger(__name__)


SteerHook = Callable[[Batch, bool], bool]
"""``steer(batch, interrupt)``: hand ``batch`` to the running run; True if it took it."""


class DispatchedRun:
    """One run as ``execute`` sees it: its batch, why it was cancelled, its hooks."""

    __slots__ = ("batch", "end_reason", "prestarted", "slot", "steer", "task")

    task: asyncio.Task[None]
    """Set right after construction: the task needs the run to exist first."""

    def __init__(self, batch: Batch, *, prestarted: bool = False) -> None:
        self.batch = batch
        self.end_reason: EndReason | None = None
        """Set before the dispatcher cancels the run: stopped by the room, or
        interrupted or detached by shutdown. None while the run was not cancelled."""
        self.prestarted = prestarted
        """The prestarter was told to ``begin`` for this room and this run takes
        that prestart over (``execute`` finds it where the prestarter keeps it;
        it may have failed or died meanwhile)."""
        self.steer: SteerHook | None = None
        """Set by ``execute`` once the run takes input (None: it cannot be
        steered). Called synchronously, from the dispatcher's event handling,
        with a steer batch of the room (``interrupt``: the room's mode asks to
        interrupt the current turn for it). True: the run took the messages
        (they are the run's from then on, whatever becomes of it: a stop or a
        shutdown does not give them back). False: they queue for the room's
        next run, and so does everything arriving after them while this run
        goes. Must not block; an exception counts as False."""
        self.slot = SlotLease(_no_lend, _no_reclaim)
        """Lends the run's slot while it waits for a person and takes one back
        (the dispatcher's; a no-op for a run made outside a dispatcher)."""


def _no_lend() -> None:
    pass


def _no_reclaim() -> int | None:
    return None


Execute = Callable[[DispatchedRun], Awaitable[None]]
"""Carries out one run; cancelled (with ``end_reason`` set) to stop, interrupt or detach it."""


class Dispatcher:
    """Decides when each room's messages go to a run, and starts the runs.

    Messages may be submitted, and runs adopted, before :meth:`serve` runs;
    they wait (and their windows close) until it does, then adopted runs
    start, then ready rooms in order.
    """

    def __init__(
        self,
        limits: DispatchLimits,
        execute: Execute,
        clock: Clock | None = None,
        *,
        mode_of: Callable[[RoomKey], DuringRun] | None = None,
        prestarter: Prestarter | None = None,
        max_prestarts: int = 0,
        room_cap: Callable[[RoomKey], int | None] | None = None,
        idle_of: Callable[[RoomKey], float | None] | None = None,
    ) -> None:
        """``mode_of`` gives a room's :class:`DuringRun` mode (None: ``queue``
        everywhere); it is asked at each message. ``prestarter`` gets up to
        ``max_prestarts`` prestarts at once (none without a prestarter).
        ``room_cap``: runs one room's conversations may have at once (None: no cap).
        ``idle_of``: a room's window follows typing and closes this long (seconds)
        after its senders stop (None, or no ``idle_of``: the plain window); asked
        when a room gets work."""
        self._limits = limits
        self._execute = execute
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._prestarter = prestarter
        # No slots until serve() opens them: a run needs the task group.
        self._scheduler = Scheduler(
            limits,
            capacity=0,
            mode_of=mode_of,
            max_prestarts=max_prestarts if prestarter is not None else 0,
            room_cap=room_cap,
            idle_of=idle_of,
        )
        self._runs: dict[RoomKey, DispatchedRun] = {}
        self._adopted: list[tuple[DispatchedRun, Execute]] = []
        """Runs adopted before serving: their tasks start when serve opens the group."""
        self._entered: set[DispatchedRun] = set()
        """Runs whose task has taken its first step: only those can hear a cancel."""
        self._shutdown_reason = EndReason.INTERRUPTED
        """Why a cancelled serve cuts off the begun runs: the last drain's reason."""
        self._group: asyncio.TaskGroup | None = None
        self._timer: TimerHandle | None = None
        self._timer_at: float | None = None
        self._fault: asyncio.Future[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._no_runs = asyncio.Event()
        self._no_runs.set()

    # -- public API ----------------------------------------------------------

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        """Run the dispatcher until cancelled; set ``ready`` once runs can start.

        On cancellation it drains (no new run begins; messages not in a
        begun run stay queued), cancels the begun runs as the last
        :meth:`drain` said (interrupted without one) and awaits them (their
        cleanup is theirs), then ``CancelledError`` propagates. For a
        graceful end, :meth:`drain` first.
        """
        if self._group is not None:
            raise RuntimeError("the dispatcher is already serving")
        self._fault = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                # Adopted runs hold their slots already; they start first.
                for run, execute in self._adopted:
                    self._spawn(run, execute)
                self._adopted.clear()
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
                    # Drain before the group cancels the runs, so runs that end
                    # during shutdown do not start queued batches, and tell the
                    # begun ones why they end.
                    self._scheduler.drain()
                    self._interrupt(self._shutdown_reason)
                    self._after(self._scheduler.take_actions())  # prestarts cancelled
        finally:
            self._group = None
            self._fault = None
            self._disarm()
            # A run cancelled before its first step never reported its end.
            for run in list(self._runs.values()):
                self._finish(run)

    def now(self) -> float:
        """The dispatcher's clock: what :meth:`submit`'s ``arrived`` is measured on."""
        return self._clock.now()

    def submit(self, message: Message, arrived: float | None = None) -> None:
        """Hand a stored message to its room. Never blocks.

        ``arrived``: when the message reached the service (:meth:`now` then),
        if before now. The window counts from there: the user's wait began when
        they sent it, not once it was recorded. Re-submitting accepted messages
        (``!retry``) is the same call.
        """
        self._after(self._scheduler.submit(message, self._clock.now(), arrived))

    def typing(self, room: RoomKey, users: frozenset[UserId]) -> None:
        """``users`` (all of them) type in ``room`` (a channel) now. Never blocks."""
        self._after(self._scheduler.typing(room, users, self._clock.now()))

    def stop(self, room: RoomKey) -> StopResult:
        """Cancel the room's active run and drop its messages not yet in a run.

        The run's ``execute`` gets ``CancelledError`` (``end_reason``
        STOPPED) and cleans up on its own; until it returns the room stays
        busy, and messages that arrive meanwhile queue for the next run. A
        run that had not reached ``execute`` yet is not called at all: its
        messages are reported as dropped, not stopped. A room waiting for a
        slot gives up its place.
        """
        result = self._scheduler.stop(room)
        if result.stopped is not None:
            self._cancel(room, EndReason.STOPPED)
        elif self._scheduler.cancel_reason(room) is EndReason.STOPPED and room in self._runs:
            # A run cut off by shutdown, still winding down: it now ends as stopped
            # (see Room.stop); it is not cancelled a second time.
            self._runs[room].end_reason = EndReason.STOPPED
        self._after(self._scheduler.take_actions())
        return result

    def release(self, room: RoomKey) -> tuple[Message, ...]:
        """Give ``room`` up: another replica owns it now (docs/replicas.md).

        As :meth:`stop`, but the run is cancelled as interrupted (the new
        owner reports it, with ``!retry``; or, when claude never got its
        prompt, the executor records nothing and the new owner runs its
        messages) and the messages returned were
        only forgotten here: nothing is to be recorded of them, they are
        still pending for the new owner.
        """
        result = self._scheduler.stop(room)
        if result.stopped is not None:
            self._cancel(room, EndReason.INTERRUPTED)
        self._after(self._scheduler.take_actions())
        return result.dropped

    def holds(self, message: Message) -> bool:
        """Whether ``message`` was submitted and is waiting, offered or in the room's run."""
        return self._scheduler.holds(message)

    def adopt(self, batch: Batch, execute: Execute) -> None:
        """Make a run that is already going (reattached after a restart) the room's run.

        ``execute`` carries it on instead of the dispatcher's own; it gets a
        :class:`DispatchedRun` of ``batch`` and is cancelled like any run: by
        :meth:`stop` (STOPPED; waiting messages are dropped), by a drain (its
        reason) or by cancelling :meth:`serve`. The run holds a slot at once,
        even beyond ``max_concurrent_runs``: other rooms wait until the runs are
        below the cap again. Messages of the room, submitted before or after,
        wait behind it and are ready at once when it ends, as behind any run.

        Before :meth:`serve`, the run's task starts when serving does, ahead of
        the room's other runs. Raises ValueError if the room has a run (begun
        or granted), RuntimeError once draining: the run stays with its
        supervisor.
        """
        self._scheduler.adopt(batch, self._clock.now())
        run = self._new_run(batch)
        self._runs[batch.room] = run
        if self._group is None:
            self._adopted.append((run, execute))
        else:
            self._spawn(run, execute)
        self._after(self._scheduler.take_actions())

    def restore(self, room: RoomKey, dropped: tuple[Message, ...]) -> None:
        """Undo a stop's drop (its write failed): the messages queue again, in front."""
        self._after(self._scheduler.restore(room, dropped, self._clock.now()))

    def replace(self, message: Message) -> bool:
        """An edited message not yet in a run now reads as ``message``; False if not waiting."""
        return self._scheduler.replace(message)

    def remove(self, message: Message) -> bool:
        """A deleted message not yet in a run never runs; False if it is not waiting."""
        removed = self._scheduler.remove(message, self._clock.now())
        self._after(self._scheduler.take_actions())
        return removed

    def drain(
        self,
        grace_s: float,
        cut_off: asyncio.Event | None = None,
        *,
        reason: EndReason = EndReason.INTERRUPTED,
    ) -> Awaitable[bool]:
        """Shut down gracefully: no run begins from this call on; begun runs may finish.

        Messages not in a begun run stay queued (the store keeps them
        pending: they run after a restart). The returned awaitable waits
        until no run is active, at most ``grace_s`` on the dispatcher's clock
        or until ``cut_off`` is set; then cancels the runs still active with
        ``end_reason`` ``reason`` and waits for them to wind down. It gives
        True if every run ended on its own. Submitting afterwards only queues.

        ``reason`` is INTERRUPTED, or DETACHED to leave the runs to their
        supervisors; cancelling :meth:`serve` afterwards uses it too. A
        :meth:`stop` of a run being cut off still makes it STOPPED.
        """
        if not reason.by_shutdown:
            raise ValueError(f"a drain does not cancel runs as {reason}")
        self._shutdown_reason = reason
        self._scheduler.drain()
        self._after(self._scheduler.take_actions())
        expired = asyncio.Event()
        timer = self._clock.call_at(self._clock.now() + grace_s, expired.set)
        return self._drained(timer, expired, cut_off, reason)

    async def _drained(
        self,
        timer: TimerHandle,
        expired: asyncio.Event,
        cut_off: asyncio.Event | None,
        reason: EndReason,
    ) -> bool:
        waits = [asyncio.ensure_future(self._no_runs.wait()), asyncio.ensure_future(expired.wait())]
        if cut_off is not None:
            waits.append(asyncio.ensure_future(cut_off.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            for wait in waits:
                wait.cancel()
        graceful = self._no_runs.is_set()
        if not graceful:
            self._interrupt(reason)
            await self._no_runs.wait()
        return graceful

    def status(self, room: RoomKey) -> RoomStatus:
        """What the room is doing now."""
        return self._scheduler.status(room)

    def conversations(self, room: RoomKey) -> list[RoomKey]:
        """The conversations of ``room`` (itself and its threads) that have work now."""
        return self._scheduler.conversations(room)

    async def wait_idle(self) -> None:
        """Return once no room has pending messages, an open batch or a run."""
        await self._idle.wait()

    def end_reason(self, room: RoomKey) -> EndReason | None:
        """Why the room's active run is ending early, if it was cancelled."""
        return self._scheduler.cancel_reason(room)

    @property
    def prestarts(self) -> int:
        """Prestarts held for rooms whose run was not granted yet."""
        return self._scheduler.prestarts

    @property
    def draining(self) -> bool:
        """:meth:`drain` was called (or serving ended): no run begins any more."""
        return self._scheduler.draining

    @property
    def active_runs(self) -> int:
        """Runs started or adopted and not yet ended (stopped ones winding down included)."""
        return self._scheduler.active_runs

    @property
    def lent_runs(self) -> int:
        """Active runs that lent their slot while they wait for a person (and not
        yet given one back); ``active_runs - lent_runs`` hold slots."""
        return self._scheduler.lent_runs

    @property
    def queued(self) -> int:
        """Messages accepted but not yet in a run, across rooms."""
        return self._scheduler.queued

    @property
    def tracked_rooms(self) -> int:
        """Rooms holding any state; 0 when every room is idle."""
        return self._scheduler.room_count

    # -- internals -----------------------------------------------------------

    def _after(self, actions: Iterable[Action]) -> None:
        """Carry out what an event decided, in order (a steer answer may decide more),
        then re-arm the timer and signal idleness."""
        todo = deque(actions)
        while todo:
            match todo.popleft():
                case StartRun(batch, prestarted):
                    self._start(batch, prestarted=prestarted)
                case SteerRun(batch, interrupt):
                    todo.extend(self._steer(batch, interrupt=interrupt))
                case BeginPrestart(room):
                    self._call_prestarter("begin", room)
                case CancelPrestart(room, why):
                    self._call_prestarter("cancel", room, why)
                case Reclaimed(room):
                    if (run := self._runs.get(room)) is not None:
                        run.slot.resumed(True)
        self._arm()
        if self._scheduler.room_count:
            self._idle.clear()
        else:
            self._idle.set()
        if self._scheduler.active_runs:
            self._no_runs.clear()
        else:
            self._no_runs.set()

    def _new_run(self, batch: Batch, *, prestarted: bool = False) -> DispatchedRun:
        run = DispatchedRun(batch, prestarted=prestarted)
        run.slot = SlotLease(
            lambda: self._lend(run), lambda: self._reclaim(run), lambda: self._went_on(run)
        )
        return run

    def _went_on(self, run: DispatchedRun) -> None:
        if self._runs.get(run.batch.room) is run:
            self._after(self._scheduler.went_on(run.batch.room))

    def _lend(self, run: DispatchedRun) -> None:
        if self._runs.get(run.batch.room) is run:
            self._after(self._scheduler.lend(run.batch.room, self._clock.now()))

    def _reclaim(self, run: DispatchedRun) -> int | None:
        if self._runs.get(run.batch.room) is not run:
            return None
        ahead, actions = self._scheduler.reclaim(run.batch.room, self._clock.now())
        self._after(actions)
        return ahead

    def _start(self, batch: Batch, *, prestarted: bool) -> None:
        run = self._new_run(batch, prestarted=prestarted)
        self._runs[batch.room] = run
        self._spawn(run, self._execute)

    def _steer(self, batch: Batch, *, interrupt: bool) -> list[Action]:
        """Offer ``batch`` to the room's run; the scheduler hears the answer at once."""
        run = self._runs.get(batch.room)
        taken = False
        if run is not None and run.steer is not None:
            try:
                taken = run.steer(batch, interrupt) is True
            except Exception:
                # Refused rather than lost: the messages queue for the next run.
                logger.exception("steering the run in room %s failed", batch.room)
        return self._scheduler.steer_answered(batch.room, batch, taken, self._clock.now())

    def _call_prestarter(self, what: str, room: RoomKey, why: str = "") -> None:
        prestarter = self._prestarter
        if prestarter is None:
            return
        try:
            if what == "begin":
                prestarter.begin(room)
            else:
                prestarter.cancel(room, why)
        except Exception:
            # The prestart is an optimisation: its failure must not wedge the rooms.
            logger.exception("prestarter %s failed for room %s", what, room)

    def _spawn(self, run: DispatchedRun, execute: Execute) -> None:
        if self._group is None:
            raise RuntimeError("a run was granted while not serving")
        run.task = self._group.create_task(
            self._run(run, execute), name=f"dispatch {run.batch.room}"
        )

    def _cancel(self, room: RoomKey, reason: EndReason) -> None:
        run = self._runs[room]
        run.end_reason = reason
        # A task cancelled before its first step never runs its coroutine, so
        # execute would never hear of it. Only an adopted run is begun before
        # then; _run cancels it itself once it has entered.
        if run in self._entered:
            run.task.cancel()

    def _interrupt(self, reason: EndReason) -> None:
        for batch in self._scheduler.interrupt(reason):
            self._cancel(batch.room, reason)

    async def _run(self, run: DispatchedRun, execute: Execute) -> None:
        self._entered.add(run)
        try:
            # The scheduler says no if the run was stopped or drained since its grant.
            if self._scheduler.begin(run.batch.room):
                if run.end_reason is not None:
                    # Cancelled before this first step (an adopted run stopped or
                    # cut off at once): execute hears it at its first await.
                    run.task.cancel()
                await execute(run)
        except Exception:
            # A failed run is the run's problem, never the dispatcher's.
            logger.exception("run in room %s failed", run.batch.room)
        finally:
            self._finish(run)

    def _finish(self, run: DispatchedRun) -> None:
        if self._runs.get(run.batch.room) is not run:
            return  # already finished (shutdown reconciliation)
        del self._runs[run.batch.room]
        self._entered.discard(run)
        run.slot.ended()
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

"""Every room plus the slot pool plus one timer heap: the whole dispatch logic, pure.

:class:`Scheduler` composes :class:`~dispatcher.room.Room` state machines
with the global :class:`~dispatcher.slots.SlotPool` and keeps one heap of
deadlines for all rooms. Its methods take ``now`` and return the batches to
start; the asyncio driver only carries those out and tells it when timers
fire and runs end. Rooms with nothing to do are forgotten.

A run already going when this process started is adopted (:meth:`adopt`):
it holds a slot at once, even beyond the cap, and rooms ready to run then
wait until the runs are below the cap again. So only runs this scheduler
grants itself are bounded by the cap. A shutdown cancels the begun runs
(:meth:`interrupt`) as interrupted or as detached (left to their supervisors).
"""

from __future__ import annotations

import heapq
import itertools

from bridge.core.model import Batch, Message, RoomKey
from dispatcher.limits import DispatchLimits
from dispatcher.room import (
    ArmTimer,
    CancelRun,
    Dropped,
    Effect,
    ReleaseSlot,
    RequestSlot,
    Restated,
    Room,
    SkipRun,
    StartRun,
    TakeSlot,
    WithdrawSlotRequest,
)
from dispatcher.slots import SlotPool
from dispatcher.status import IDLE, EndReason, RoomStatus, StopResult


class Scheduler:
    """The dispatch state of all rooms; see the module docstring.

    ``capacity`` is the number of run slots, ``limits.max_concurrent_runs``
    unless given; the driver starts with 0 so nothing runs before it serves.
    """

    def __init__(self, limits: DispatchLimits, capacity: int | None = None) -> None:
        self._limits = limits
        self._rooms: dict[RoomKey, Room] = {}
        self._rooms_peak = 0
        self._slots = SlotPool(limits.max_concurrent_runs if capacity is None else capacity)
        # (deadline, tie-breaker, room). Entries are never removed early: a
        # room ignores ticks it no longer wants, and a forgotten room's entry
        # is skipped, so arming and stopping stay O(log n) / O(1).
        self._timers: list[tuple[float, int, RoomKey]] = []
        self._seq = itertools.count()
        self._queued = 0
        self._running = 0
        self._draining = False

    # -- queries -------------------------------------------------------------

    @property
    def limits(self) -> DispatchLimits:
        return self._limits

    @property
    def capacity(self) -> int:
        return self._slots.capacity

    @property
    def draining(self) -> bool:
        """:meth:`drain` was called: no run begins any more."""
        return self._draining

    @property
    def room_count(self) -> int:
        """Rooms holding state: those with pending messages or a run."""
        return len(self._rooms)

    @property
    def active_runs(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        """Messages accepted but not yet in a run, across rooms."""
        return self._queued

    @property
    def waiting_for_slot(self) -> int:
        """Rooms ready to run that wait for a slot."""
        return self._slots.waiting

    @property
    def timer_entries(self) -> int:
        """Entries in the timer heap, stale ones included (for tests and the bench)."""
        return len(self._timers)

    def next_deadline(self) -> float | None:
        """When :meth:`fire_timers` should be called next, if ever."""
        return self._timers[0][0] if self._timers else None

    def status(self, room: RoomKey) -> RoomStatus:
        state = self._rooms.get(room)
        if state is None:
            return IDLE
        return RoomStatus(
            running=state.run,
            running_since=state.run_since,
            waiting=state.pending,
            waiting_for_slot=state.ready,
            stopping=state.stopping,
        )

    # -- events --------------------------------------------------------------

    def submit(self, message: Message, now: float) -> list[Batch]:
        """Accept a message (new or re-submitted) for its room."""
        room = self._room(message.room)
        self._queued += 1
        return self._apply(room, room.message(message, now), now)

    def fire_timers(self, now: float) -> list[Batch]:
        """Process every deadline reached at ``now``, earliest first."""
        started: list[Batch] = []
        while self._timers and self._timers[0][0] <= now:
            _, _, key = heapq.heappop(self._timers)
            room = self._rooms.get(key)
            if room is not None:
                started += self._apply(room, room.tick(now), now)
        return started

    def run_finished(self, key: RoomKey, now: float) -> list[Batch]:
        """The room's run ended; its slot goes to the next room in line."""
        room = self._rooms.get(key)
        if room is None or room.run is None:
            raise RuntimeError(f"room {key} has no run to finish")
        self._running -= 1
        return self._apply(room, room.run_finished(now), now)

    def adopt(self, batch: Batch, now: float) -> None:
        """A run already going (reattached after a restart) becomes its room's run.

        It has begun and holds a slot, beyond the cap if need be. Messages of
        the room not yet in a run wait behind it; when it ends (report it with
        :meth:`run_finished`) they are ready at once, as behind any run.
        Raises ValueError if the room has a run, RuntimeError once draining
        (the run stays with its supervisor).
        """
        if self._draining:
            raise RuntimeError("no run is adopted while draining")
        room = self._room(batch.room)  # only a room that has a run refuses
        for effect in room.adopt(batch, now):
            match effect:
                case WithdrawSlotRequest():
                    self._slots.withdraw(room.key)
                case TakeSlot():
                    self._slots.take(room.key)
                    self._running += 1
                case _:
                    raise AssertionError(f"unexpected effect of an adoption: {effect}")

    def begin(self, key: RoomKey) -> bool:
        """The owner is about to carry out the room's granted run: True if it may."""
        room = self._rooms.get(key)
        if room is None or room.run is None:
            raise RuntimeError(f"room {key} has no run to begin")
        return room.begin()

    def stop(self, key: RoomKey) -> StopResult:
        """Cancel the room's begun run and drop its messages not yet in a run.

        The run keeps its slot and the room stays running until
        :meth:`run_finished`: the run is still winding down. A run granted
        but not begun never begins; its messages are dropped with the rest.
        """
        room = self._rooms.get(key)
        if room is None:
            return StopResult(stopped=None, dropped=())
        stopped: Batch | None = None
        dropped: tuple[Message, ...] = ()
        skipped = 0
        for effect in room.stop():
            match effect:
                case CancelRun(batch):
                    stopped = batch
                case Restated():
                    pass  # the reason changed; cancel_reason tells it
                case SkipRun(batch):
                    skipped = len(batch.messages)  # counted as running, not queued
                case Dropped(messages):
                    dropped = messages
                    self._queued -= len(messages) - skipped
                case WithdrawSlotRequest():
                    self._slots.withdraw(key)
                case _:
                    raise AssertionError(f"unexpected effect of stop: {effect}")
        self._forget_if_idle(room)
        return StopResult(stopped=stopped, dropped=dropped)

    def restore(self, key: RoomKey, messages: tuple[Message, ...], now: float) -> list[Batch]:
        """Undo a stop's drop: ``messages`` go back in front of the room's queue."""
        if not messages:
            return []
        room = self._room(key)
        self._queued += len(messages)
        return self._apply(room, room.restore(messages, now), now)

    def replace(self, message: Message) -> bool:
        """An edit of a message not yet in a run; False if it is not waiting."""
        room = self._rooms.get(message.room)
        return room is not None and room.replace(message)

    def remove(self, message: Message, now: float) -> bool:
        """A deletion of a message not yet in a run; False if it is not waiting."""
        room = self._rooms.get(message.room)
        if room is None:
            return False
        removed, effects = room.remove(message)
        if removed:
            self._queued -= 1
        for effect in effects:
            match effect:
                case WithdrawSlotRequest():
                    self._slots.withdraw(room.key)
                case _:
                    raise AssertionError(f"unexpected effect of a removal: {effect}")
        self._forget_if_idle(room)
        return removed

    def drain(self) -> None:
        """Shutdown: from now on no run begins; runs granted but not begun go back to the queue.

        Begun runs go on until they end or :meth:`interrupt` cancels them.
        Messages not in a begun run stay queued (durably pending: they run
        after a restart).
        """
        self._draining = True
        self._slots.resize(0)
        for room in self._rooms.values():
            for effect in room.drain():
                match effect:
                    case SkipRun(batch):
                        self._queued += len(batch.messages)
                    case _:
                        raise AssertionError(f"unexpected effect of a drain: {effect}")

    def interrupt(self, reason: EndReason = EndReason.INTERRUPTED) -> list[Batch]:
        """Shutdown cut-off: the begun runs to cancel for ``reason``, in room order.

        ``reason`` is INTERRUPTED, or DETACHED when the shutdown leaves the runs
        to their supervisors. Runs already being cancelled keep their reason.
        """
        cancelled: list[Batch] = []
        for key in sorted(self._rooms):
            for effect in self._rooms[key].interrupt(reason):
                match effect:
                    case CancelRun(batch, why) if why is reason:
                        cancelled.append(batch)
                    case _:
                        raise AssertionError(f"unexpected effect of an interrupt: {effect}")
        return cancelled

    def cancel_reason(self, key: RoomKey) -> EndReason | None:
        """Why the room's run is ending early, if it was cancelled."""
        room = self._rooms.get(key)
        return None if room is None else room.cancel_reason

    def set_capacity(self, capacity: int, now: float) -> list[Batch]:
        """Open (or close, with 0) run slots; waiting rooms get new ones in order.

        Once draining, slots stay closed.
        """
        if self._draining:
            capacity = 0
        started: list[Batch] = []
        for key in self._slots.resize(capacity):
            started += self._grant(key, now)
        return started

    # -- internals -----------------------------------------------------------

    def _room(self, key: RoomKey) -> Room:
        room = self._rooms.get(key)
        if room is None:
            room = self._rooms[key] = Room(key, self._limits)
            self._rooms_peak = max(self._rooms_peak, len(self._rooms))
        return room

    def _apply(self, room: Room, effects: list[Effect], now: float) -> list[Batch]:
        started: list[Batch] = []
        for effect in effects:
            match effect:
                case ArmTimer(at):
                    heapq.heappush(self._timers, (at, next(self._seq), room.key))
                case RequestSlot():
                    for key in self._slots.request(room.key):
                        started += self._grant(key, now)
                case ReleaseSlot():
                    for key in self._slots.release(room.key):
                        started += self._grant(key, now)
                case _:
                    raise AssertionError(f"unexpected effect: {effect}")
        self._forget_if_idle(room)
        return started

    def _grant(self, key: RoomKey, now: float) -> list[Batch]:
        started: list[Batch] = []
        for effect in self._rooms[key].slot_granted(now):
            match effect:
                case StartRun(batch):
                    started.append(batch)
                    self._running += 1
                    self._queued -= len(batch.messages)
                case _:
                    raise AssertionError(f"unexpected effect of a grant: {effect}")
        return started

    def _forget_if_idle(self, room: Room) -> None:
        if not room.idle:
            return
        del self._rooms[room.key]
        # A dict never shrinks on deletion: after a burst of rooms its table
        # would stay at the peak size forever. Rebuild it once mostly empty
        # (amortized O(1) per room) so idle rooms really cost nothing.
        if self._rooms_peak >= 64 and len(self._rooms) <= self._rooms_peak // 8:
            self._rooms = dict(self._rooms)
            self._rooms_peak = len(self._rooms)

"""Every room plus the slot pool plus one timer heap: the whole dispatch logic, pure.

:class:`Scheduler` composes :class:`~dispatcher.room.Room` state machines with the global
:class:`~dispatcher.slots.SlotPool`; its methods take ``now`` and return the :data:`Action` s
to carry out, in order (or leave them for :meth:`Scheduler.take_actions`). It also decides
prestarts, typing, adopted runs and shutdown (docs/live-runs.md, "Dispatcher (`dispatcher/`)"
and "One room's rules").
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from bridge.core.model import Batch, Message, RoomKey, UserId
from dispatcher.limits import DispatchLimits
from dispatcher.policy import DuringRun, PrestartCancel
from dispatcher.room import (
    ArmTimer,
    BeginPrestart,
    CancelPrestart,
    CancelRun,
    Dropped,
    Effect,
    Phase,
    ReleaseSlot,
    RequestSlot,
    Restated,
    Room,
    SkipRun,
    StartRun,
    SteerRun,
    TakeSlot,
    WithdrawSlotRequest,
)
from dispatcher.slots import SlotPool
from dispatcher.status import IDLE, EndReason, Reclaimed, RoomStatus, StopResult

Action = StartRun | SteerRun | BeginPrestart | CancelPrestart | Reclaimed
"""What the scheduler asks its owner to do."""


def _queue_everywhere(room: RoomKey) -> DuringRun:
    return DuringRun.QUEUE


def _plain_window(room: RoomKey) -> float | None:
    return None


class Scheduler:
    """The dispatch state of all rooms; see the module docstring.

    ``capacity`` is the number of run slots, ``limits.max_concurrent_runs``
    unless given; the driver starts with 0 so nothing runs before it serves.
    """

    def __init__(
        self,
        limits: DispatchLimits,
        capacity: int | None = None,
        *,
        mode_of: Callable[[RoomKey], DuringRun] | None = None,
        max_prestarts: int = 0,
        room_cap: Callable[[RoomKey], int | None] | None = None,
        idle_of: Callable[[RoomKey], float | None] | None = None,
    ) -> None:
        if max_prestarts < 0:
            raise ValueError("max_prestarts must not be negative")
        self._limits = limits
        self._mode_of = mode_of if mode_of is not None else _queue_everywhere
        self._idle_of = idle_of if idle_of is not None else _plain_window
        self._typing: dict[RoomKey, frozenset[UserId]] = {}
        """Who types, by channel; only channels where someone does."""
        self._following: dict[RoomKey, set[RoomKey]] = {}
        """The rooms with state that follow typing, by channel."""
        self._max_prestarts = max_prestarts
        self._prestarts: dict[RoomKey, None] = {}
        """Rooms holding a prestart, without a granted run yet (in the order begun)."""
        self._carried: set[RoomKey] = set()
        """Rooms whose granted run, not begun yet, carries a prestart."""
        self._actions: list[Action] = []
        """Decided by the event being handled, not yet handed out."""
        self._rooms: dict[RoomKey, Room] = {}
        self._rooms_peak = 0
        self._slots = SlotPool(
            limits.max_concurrent_runs if capacity is None else capacity,
            *(() if room_cap is None else (room_cap,)),
        )
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
    def lent_runs(self) -> int:
        """Runs that lent their slot (waiting for a person, or for a slot back)."""
        return self._slots.lent

    @property
    def queued(self) -> int:
        """Messages accepted but not yet in a run, across rooms."""
        return self._queued

    @property
    def prestarts(self) -> int:
        """Prestarts held for rooms without a granted run."""
        return len(self._prestarts)

    def holds_prestart(self, room: RoomKey) -> bool:
        """``room`` holds a prestart, alone or carried by its granted run not begun yet."""
        return room in self._prestarts or room in self._carried

    def offered(self, room: RoomKey) -> Batch | None:
        """The steer batch offered to the room's run and not answered yet."""
        state = self._rooms.get(room)
        return None if state is None else state.offered

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

    def conversations(self, room: RoomKey) -> list[RoomKey]:
        """The conversations of ``room`` (itself and its threads) with work, in key order."""
        channel = room.channel
        return sorted(key for key in self._rooms if key.channel == channel)

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
            steering=state.steering,
            steered=state.steered,
            lent=self._slots.lends(room),
            reclaiming=(self._slots.ahead(room) if room in self._slots.reclaiming else None),
        )

    def take_actions(self) -> list[Action]:
        """What the last events decided and did not return (stop, remove, drain, adopt)."""
        actions, self._actions = self._actions, []
        return actions

    # -- events --------------------------------------------------------------

    def submit(self, message: Message, now: float, arrived: float | None = None) -> list[Action]:
        """Accept a message (new or re-submitted) for its room; it ``arrived`` (when
        given) before ``now``, and its window counts from then (see :meth:`Room.message`)."""
        key = message.room
        # Asked before anything changes: the mode comes from outside and may raise.
        mode = DuringRun.QUEUE if self._draining else self._mode_of(key)
        opens = self._opens(key)
        room = self._room(key)
        self._queued += 1
        self._apply(room, room.message(message, now, mode, arrived), now)
        if opens:
            self._maybe_prestart(room)
        return self.take_actions()

    def typing(self, channel: RoomKey, users: frozenset[UserId], now: float) -> list[Action]:
        """``users`` (all of them) type in ``channel`` from ``now`` on; its conversations
        that follow typing hear it (see :mod:`dispatcher.room`)."""
        channel = channel.channel
        if users:
            self._typing[channel] = users
        else:
            self._typing.pop(channel, None)
        for key in list(self._following.get(channel, ())):
            room = self._rooms[key]
            self._apply(room, room.typing(users, now), now)
        return self.take_actions()

    def fire_timers(self, now: float) -> list[Action]:
        """Process every deadline reached at ``now``, earliest first."""
        while self._timers and self._timers[0][0] <= now:
            _, _, key = heapq.heappop(self._timers)
            room = self._rooms.get(key)
            if room is not None:
                self._apply(room, room.tick(now), now)
        return self.take_actions()

    def steer_answered(self, key: RoomKey, batch: Batch, taken: bool, now: float) -> list[Action]:
        """The room's run answered the :class:`SteerRun` of ``batch``.

        ``taken``: its messages are the run's now. Refused: they queue for the
        room's next run. An answer to an offer the room no longer has (its run
        ended, or it was stopped, since) changes nothing.
        """
        room = self._rooms.get(key)
        if room is None:
            return []
        answered, effects = room.steer_answered(batch, taken)
        if answered and taken:
            self._queued -= len(batch.messages)
        self._apply(room, effects, now)
        return self.take_actions()

    def run_finished(self, key: RoomKey, now: float) -> list[Action]:
        """The room's run ended; its slot goes to the next room in line."""
        room = self._rooms.get(key)
        if room is None or room.run is None:
            raise RuntimeError(f"room {key} has no run to finish")
        self._running -= 1
        self._apply(room, room.run_finished(now), now)
        return self.take_actions()

    def lend(self, key: RoomKey, now: float) -> list[Action]:
        """The room's run waits for a person: its slot goes to the next in line.

        Nothing happens unless the run holds a slot (already lent: no-op).
        The run stays the room's run; it counts for its room's cap still.
        """
        room = self._rooms.get(key)
        if room is None or room.run is None:
            raise RuntimeError(f"room {key} has no run to lend a slot")
        if self._slots.holds(key):
            for granted in self._slots.lend(key):
                self._grant(granted, now)
        return self.take_actions()

    def reclaim(self, key: RoomKey, now: float) -> tuple[int | None, list[Action]]:
        """The room's run is to go on: it wants its slot back.

        Gives None if the run holds a slot now (it had not lent it, or one was
        free); otherwise how many reclaimers are ahead of it: a
        :class:`Reclaimed` action tells when it holds one again (a run that ends
        first gets none). Reclaimers go before rooms waiting to start. Once
        draining, the slot comes back at once: the going runs finish.
        """
        room = self._rooms.get(key)
        if room is None or room.run is None:
            raise RuntimeError(f"room {key} has no run to reclaim a slot")
        if not self._slots.lends(key):
            return None, self.take_actions()
        if key in self._slots.reclaiming:
            return self._slots.ahead(key), self.take_actions()
        if self._draining:
            self._slots.reclaim_now(key)
            return None, self.take_actions()
        granted = self._slots.reclaim(key)
        for other in granted:
            if other != key:
                self._grant(other, now)
        if key in granted:
            return None, self.take_actions()  # at once: nothing to announce
        self._give_way()  # a run waits for a slot: prestarts give way, as for a room
        return self._slots.ahead(key), self.take_actions()

    def went_on(self, key: RoomKey) -> list[Action]:
        """The room's run goes on without waiting for a slot (claude withdrew its request
        and works on): it holds a slot again at once, beyond the capacity if need be
        (as an adopted run: nothing is granted until the holders are below it). A
        reclaim it waited on is answered (:class:`Reclaimed`)."""
        room = self._rooms.get(key)
        if room is None or room.run is None:
            raise RuntimeError(f"room {key} has no run to go on")
        if self._slots.lends(key):
            reclaiming = key in self._slots.reclaiming
            self._slots.reclaim_now(key)
            if reclaiming:
                self._actions.append(Reclaimed(key))
        return self.take_actions()

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
        effects = room.adopt(batch, now)
        # Its batch will not start: the adopted run stands in for it.
        self._cancel_prestart(room.key, PrestartCancel.ADOPTED)
        for effect in effects:
            match effect:
                case WithdrawSlotRequest():
                    self._slots.withdraw(room.key)
                case TakeSlot():
                    self._slots.take(room.key)
                    self._running += 1
                case _:
                    raise AssertionError(f"unexpected effect of an adoption: {effect}")

    def begin(self, key: RoomKey) -> bool:
        """The owner is about to carry out the room's granted run: True if it may.

        A prestart the run carries is consumed by it then (``execute`` takes it).
        """
        room = self._rooms.get(key)
        if room is None or room.run is None:
            raise RuntimeError(f"room {key} has no run to begin")
        began = room.begin()
        if began:
            self._carried.discard(key)
        return began

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
                    self._cancel_prestart(key, PrestartCancel.DROPPED)
                case Dropped(messages):
                    dropped = messages
                    self._queued -= len(messages) - skipped
                case WithdrawSlotRequest():
                    self._slots.withdraw(key)
                case _:
                    raise AssertionError(f"unexpected effect of stop: {effect}")
        if room.run is None:
            self._cancel_prestart(key, PrestartCancel.DROPPED)  # its open batch is gone
        self._forget_if_idle(room)
        return StopResult(stopped=stopped, dropped=dropped)

    def restore(self, key: RoomKey, messages: tuple[Message, ...], now: float) -> list[Action]:
        """Undo a stop's drop: ``messages`` go back in front of the room's queue."""
        if not messages:
            return []
        opens = self._opens(key)
        room = self._room(key)
        self._queued += len(messages)
        self._apply(room, room.restore(messages, now), now)
        if opens:
            self._maybe_prestart(room)
        return self.take_actions()

    def holds(self, message: Message) -> bool:
        """Whether ``message`` is in its room's hands (waiting, offered or running)."""
        room = self._rooms.get(message.room)
        return room is not None and room.holds(message.id)

    def replace(self, message: Message) -> bool:
        """An edit of a message not yet in a run; False if it is not waiting."""
        room = self._rooms.get(message.room)
        return room is not None and room.replace(message)

    def remove(self, message: Message, now: float) -> bool:
        """A deletion of a message not yet in a run; False if it is not waiting."""
        room = self._rooms.get(message.room)
        if room is None:
            return False
        removed, effects = room.remove(message, now)
        if removed:
            self._queued -= 1
        # A slot request given up, or (following typing) the rest of the batch quiet now.
        self._apply(room, effects, now)
        return removed

    def drain(self) -> None:
        """Shutdown: from now on no run begins; runs granted but not begun go back to the queue.

        Begun runs go on until they end or :meth:`interrupt` cancels them.
        Messages not in a begun run stay queued (durably pending: they run
        after a restart).
        """
        self._draining = True
        self._slots.resize(0)
        # Runs already going finish: whoever waits for its slot back has it now.
        for key in self._slots.reclaiming:
            self._slots.reclaim_now(key)
            self._actions.append(Reclaimed(key))
        for room in self._rooms.values():
            for effect in room.drain():
                match effect:
                    case SkipRun(batch):
                        self._queued += len(batch.messages)
                    case _:
                        raise AssertionError(f"unexpected effect of a drain: {effect}")
        # No run begins any more: no prestart will be taken (those carried by
        # runs the drain keeps from beginning included).
        for key in [*self._prestarts, *sorted(self._carried)]:
            self._cancel_prestart(key, PrestartCancel.SHUTDOWN)

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

    def set_capacity(self, capacity: int, now: float) -> list[Action]:
        """Open (or close, with 0) run slots; waiting rooms get new ones in order.

        Once draining, slots stay closed.
        """
        if self._draining:
            capacity = 0
        for key in self._slots.resize(capacity):
            self._grant(key, now)
        return self.take_actions()

    # -- internals -----------------------------------------------------------

    def _room(self, key: RoomKey) -> Room:
        room = self._rooms.get(key)
        if room is None:
            idle_s = self._idle_of(key)
            channel = key.channel
            typing = self._typing.get(channel, frozenset())
            room = self._rooms[key] = Room(key, self._limits, idle_s=idle_s, typing=typing)
            self._rooms_peak = max(self._rooms_peak, len(self._rooms))
            if idle_s is not None:
                self._following.setdefault(channel, set()).add(key)
        return room

    def _apply(self, room: Room, effects: list[Effect], now: float) -> None:
        for effect in effects:
            match effect:
                case ArmTimer(at):
                    heapq.heappush(self._timers, (at, next(self._seq), room.key))
                case RequestSlot():
                    for key in self._slots.request(room.key):
                        self._grant(key, now)
                    if self._slots.short_for(room.key):
                        # (Not for a thread waiting for its room's cap: slots are spare.)
                        self._give_way()
                case ReleaseSlot():
                    for key in self._slots.release(room.key):
                        self._grant(key, now)
                case WithdrawSlotRequest():
                    self._slots.withdraw(room.key)
                case SteerRun():
                    self._actions.append(effect)
                case _:
                    raise AssertionError(f"unexpected effect: {effect}")
        self._forget_if_idle(room)

    def _grant(self, key: RoomKey, now: float) -> None:
        if self._rooms[key].run is not None:
            # A reclaimer (a room waiting to start has no run): its run goes on.
            self._actions.append(Reclaimed(key))
            return
        for effect in self._rooms[key].slot_granted(now):
            match effect:
                case StartRun(batch):
                    self._running += 1
                    self._queued -= len(batch.messages)
                    prestarted = key in self._prestarts
                    if prestarted:
                        del self._prestarts[key]
                        self._carried.add(key)
                    self._actions.append(StartRun(batch, prestarted=prestarted))
                case _:
                    raise AssertionError(f"unexpected effect of a grant: {effect}")

    def _opens(self, key: RoomKey) -> bool:
        """A message for ``key`` now would open a batch in a room without a run."""
        room = self._rooms.get(key)
        return room is None or room.idle

    def _maybe_prestart(self, room: Room) -> None:
        """A batch opened in ``room``: begin a prestart for it if one is allowed.

        Only for a batch still gathering: one granted at once starts cold
        anyway, and one waiting for a slot means no budget is spare (one
        waiting only for its room's ``max_runs_per_room`` leaves slots spare).
        """
        if (
            room.phase is Phase.GATHERING
            and room.key not in self._prestarts
            and len(self._prestarts) < self._max_prestarts
            and self._slots.in_use + len(self._prestarts) < self._slots.capacity
            and not self._slots.short
        ):
            self._prestarts[room.key] = None
            self._actions.append(BeginPrestart(room.key))

    def _give_way(self) -> None:
        """A room waits for a slot: prestarts of rooms not waiting themselves are cancelled.

        The waiting rooms' own prestarts stay: each is taken by its room's
        run, the next ones to start.
        """
        for key in [k for k in self._prestarts if not self._slots.is_waiting(k)]:
            self._cancel_prestart(key, PrestartCancel.SLOT_NEEDED)

    def _cancel_prestart(self, key: RoomKey, why: PrestartCancel) -> None:
        if key in self._prestarts:
            del self._prestarts[key]
        elif key in self._carried:
            self._carried.discard(key)
        else:
            return
        self._actions.append(CancelPrestart(key, why))

    def _forget_if_idle(self, room: Room) -> None:
        if not room.idle:
            return
        self._cancel_prestart(room.key, PrestartCancel.IDLE)
        del self._rooms[room.key]
        following = self._following.get(room.key.channel)
        if following is not None:
            following.discard(room.key)
            if not following:
                del self._following[room.key.channel]
        # A dict never shrinks on deletion: after a burst of rooms its table
        # would stay at the peak size forever. Rebuild it once mostly empty
        # (amortized O(1) per room) so idle rooms really cost nothing.
        if self._rooms_peak >= 64 and len(self._rooms) <= self._rooms_peak // 8:
            self._rooms = dict(self._rooms)
            self._rooms_peak = len(self._rooms)

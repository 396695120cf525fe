"""Property tests: random schedules against the pure scheduler (rooms + slots + timers).

A hypothesis state machine submits, re-submits, moves time, finishes runs,
stops rooms, adopts runs already going (before the scheduler serves, as at a
restart, and while it serves) and drains (interrupting or detaching), and
checks after every step:

- never two runs in one room, and a batch never mixes threads; the cap is
  never exceeded by the runs the scheduler grants itself, counting adopted
  runs as running (an adoption alone may go beyond it); a room with a run
  adopts none, and nothing is adopted while draining;
- no room waits for a slot while a slot is free, and slots go to waiting
  rooms in the order they became ready (rooms that became ready at the same
  step may go in either order); a thread whose room is at its
  ``max_runs_per_room`` (drawn: none or 1) waits, keeping its place;
- per room, begun batches and drops so far, concatenated, then the granted
  batch that has not begun, then the waiting messages, are the submissions
  (exactly once, in order); edits change a message only while it waits,
  deletions remove it only while it waits;
- a run stopped before it began never begins and its messages are dropped
  (first); a stop whose drop is undone (its write failed) puts them back in
  front; a drain begins nothing more, puts granted-but-not-begun batches back
  in front, and its interrupt cancels exactly the begun runs (adopted ones
  too) not already stopping, for the drain's reason (interrupted or
  detached); a stop after the interrupt makes the run stopped (not cancelled
  again);
- an adopted run has begun; messages waiting in its room, or arriving while
  it goes, queue behind it and follow it as any run's queue;
- a gathering room's window has not closed yet (it flushes exactly when the
  window closes: ``min(last + coalesce, first + max_wait)``), and a room that
  left gathering did so only once its window closed or it held ``max_batch``.

Rooms have during-run modes (``queue``, ``steer``, ``interrupt``, changed
at random too), and the machine answers steer offers at random (taken or
refused, also stale answers to offers the room no longer has). It checks:

- a steer batch is offered only to a begun run not being cancelled, one at
  a time, at most ``max_batch`` messages, all from the run's thread, and always the room's oldest
  messages not in a run; a taken batch counts as delivered (so every message
  ends in exactly one started batch, taken steer batch or drop, in order);
  a refused one, or one whose run ended first, queues in front; a stop drops
  an offer out; a stale answer changes nothing;
- prestarts: begun only for a gathering room while no room waits for a slot,
  never more held than ``max_prestarts``, runs plus prestarts held within the
  capacity; a grant carries the room's prestart (``StartRun.prestarted``);
  each begun prestart is consumed (its run begins) or cancelled exactly once,
  for the reason its event allows; while a room waits for a slot only waiting
  rooms hold prestarts;
- a twin scheduler without prestarts, fed the same events, starts the same
  runs and offers the same steer batches at every step: a prestart never
  delays (or changes) a run.

At the end it finishes everything and checks every message ran, was taken
by steering or dropped, or (after a drain) still waits, and that no prestart
is left.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from bridge.core.model import Batch, Message, RoomKey
from dispatcher.limits import DispatchLimits
from dispatcher.policy import DuringRun, PrestartCancel
from dispatcher.room import BeginPrestart, CancelPrestart, StartRun, SteerRun
from dispatcher.scheduler import Action, Scheduler
from dispatcher.status import EndReason, RoomStatus
from tests.dispatcher.fakes import Messages, room

ROOMS = [room(0), room(1), room(2).in_thread("x"), room(2).in_thread("y")]
"""Conversations: two rooms, and two threads of a third (``max_runs_per_room``)."""
# Multiples of 1/4 add up exactly in binary floating point, so the test's
# deadlines and the scheduler's are the same numbers.
STEPS = st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 3.0])


MODES = st.sampled_from(list(DuringRun))

# Why each event may cancel a prestart.
CANCELS: dict[str, set[PrestartCancel]] = {
    "submit": {PrestartCancel.SLOT_NEEDED},
    "fire_timers": {PrestartCancel.SLOT_NEEDED},
    "run_finished": {PrestartCancel.SLOT_NEEDED},
    "restore": {PrestartCancel.SLOT_NEEDED},
    "stop": {PrestartCancel.DROPPED},
    "remove": {PrestartCancel.IDLE},
    "drain": {PrestartCancel.SHUTDOWN},
    "adopt": {PrestartCancel.ADOPTED},
}


def runs_and_steers(actions: list[Action]) -> list[tuple[object, ...]]:
    """What a twin without prestarts must decide alike."""
    return [
        ("start", a.batch) if isinstance(a, StartRun) else ("steer", a.batch, a.interrupt)
        for a in actions
        if isinstance(a, StartRun | SteerRun)
    ]


def gathering(status: RoomStatus) -> bool:
    return status.running is None and not status.waiting_for_slot and status.waiting > 0


class Window:
    """The test's own view of an open batch."""

    def __init__(self, now: float) -> None:
        self.first = now
        self.last = now
        self.count = 1

    def closes(self, limits: DispatchLimits) -> float:
        return min(self.last + limits.coalesce_s, self.first + limits.max_wait_s)


THREADS = st.sampled_from([None, None, "t1", "t2"])
"""A message's thread: mostly the room's top level."""


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.make = Messages()
        self.now = 0.0
        self.submitted: dict[RoomKey, list[Message]] = {r: [] for r in ROOMS}
        self.outputs: dict[RoomKey, list[Message]] = {r: [] for r in ROOMS}
        self.running: dict[RoomKey, Batch] = {}
        self.adopted: set[RoomKey] = set()
        """Rooms whose running run was adopted (its messages came from an earlier process)."""
        self.serving = False
        self.inflight: dict[RoomKey, list[Message]] = {r: [] for r in ROOMS}
        """The granted batch that has not begun (nor been skipped)."""
        self.begin_asked: set[RoomKey] = set()
        """Runs whose owner asked to begin (it reports their end only after)."""
        self.began: set[RoomKey] = set()
        self.stopping: dict[RoomKey, EndReason] = {}
        self.draining = False
        self.edits = 0
        self.windows: dict[RoomKey, Window] = {}
        self.slot_queue: list[set[RoomKey]] = []
        """Rooms seen waiting for a slot, grouped by the step they were first seen in."""
        self.modes: dict[RoomKey, DuringRun] = {}
        self.offered: dict[RoomKey, Batch] = {}
        """The steer batch offered to the room's run, not answered yet."""
        self.stale: list[tuple[RoomKey, Batch]] = []
        """Offers the rooms no longer have (run ended, stopped): answers are ignored."""
        self.held: set[RoomKey] = set()
        """Prestarts begun, not carried by a grant yet."""
        self.carried: set[RoomKey] = set()
        """Prestarts carried by a granted run that has not begun."""
        self.prestarts_begun = 0
        self.prestarts_ended = 0

    @initialize(
        coalesce=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
        max_wait=st.sampled_from([0.0, 1.0, 3.0]),
        max_batch=st.integers(1, 4),
        cap=st.integers(1, 3),
        serving=st.booleans(),
        modes=st.lists(MODES, min_size=len(ROOMS), max_size=len(ROOMS)),
        max_prestarts=st.integers(0, 3),
        room_cap=st.sampled_from([None, 1]),
    )
    def setup(  # noqa: PLR0917 (hypothesis passes the strategies by name)
        self,
        coalesce: float,
        max_wait: float,
        max_batch: int,
        cap: int,
        serving: bool,
        modes: list[DuringRun],
        max_prestarts: int,
        room_cap: int | None,
    ) -> None:
        self.limits = DispatchLimits(coalesce, max_wait, max_batch, cap)
        self.room_cap = room_cap
        self.modes = dict(zip(ROOMS, modes, strict=True))
        self.max_prestarts = max_prestarts
        # Not serving yet, as the driver starts: no slots, so runs can only be adopted.
        capacity = None if serving else 0
        self.scheduler = Scheduler(
            self.limits,
            capacity,
            mode_of=self.modes.__getitem__,
            max_prestarts=max_prestarts,
            room_cap=self._cap_of,
        )
        self.twin = Scheduler(
            self.limits, capacity, mode_of=self.modes.__getitem__, room_cap=self._cap_of
        )
        self.serving = serving

    # -- rules ---------------------------------------------------------------

    @rule(index=st.integers(0, len(ROOMS) - 1), thread=THREADS)
    def submit(self, index: int, thread: str | None) -> None:
        self._submit(self.make(ROOMS[index], thread=thread))

    @precondition(lambda self: any(self.submitted.values()))
    @rule(data=st.data())
    def resubmit(self, data: st.DataObject) -> None:
        """``!retry``: an accepted message comes again."""
        earlier = [m for msgs in self.submitted.values() for m in msgs]
        self._submit(data.draw(st.sampled_from(earlier)))

    @precondition(lambda self: not self.serving)
    @rule()
    def serve(self) -> None:
        """The driver opens the slots (none once draining)."""
        self.serving = True
        self._do("set_capacity", self.limits.max_concurrent_runs, self.now)
        self._check_windows()

    @rule(index=st.integers(0, len(ROOMS) - 1), size=st.integers(1, 3))
    def adopt(self, index: int, size: int) -> None:
        """A run an earlier process started, reattached: it becomes the room's run."""
        key = ROOMS[index]
        batch = Batch(key, tuple(self.make(key) for _ in range(size)))
        before = self.scheduler.status(key)
        if self.draining:
            for scheduler in (self.scheduler, self.twin):
                with pytest.raises(RuntimeError, match="draining"):
                    scheduler.adopt(batch, self.now)
            assert self.scheduler.status(key) == before
            return
        if key in self.running:
            for scheduler in (self.scheduler, self.twin):
                with pytest.raises(ValueError, match="already has a run"):
                    scheduler.adopt(batch, self.now)
            assert self.scheduler.status(key) == before
            return
        self._do("adopt", batch, self.now)
        self.running[key] = batch
        self.adopted.add(key)
        self.began.add(key)
        # What waited (gathering or ready) now waits behind the run.
        self.windows.pop(key, None)
        for tier in self.slot_queue:
            tier.discard(key)
        after = self.scheduler.status(key)
        assert after.running == batch
        assert after.waiting == before.waiting
        assert not after.waiting_for_slot
        self._check_windows()

    @rule(step=STEPS)
    def advance(self, step: float) -> None:
        target = self.now + step
        deadline = self.scheduler.next_deadline()
        while deadline is not None and deadline <= target:
            # Never called back for a time already passed.
            assert deadline >= self.now
            self.now = deadline
            self._do("fire_timers", self.now)
            self._check_windows()
            deadline = self.scheduler.next_deadline()
        self.now = target

    @precondition(lambda self: set(self.running) - self.begin_asked)
    @rule(data=st.data())
    def begin(self, data: st.DataObject) -> None:
        """The driver's task reaches ``execute``: only a run still granted may begin."""
        key = data.draw(st.sampled_from(sorted(set(self.running) - self.begin_asked)))
        self.begin_asked.add(key)
        expected = bool(self.inflight[key]) or key in self.adopted
        assert self._do("begin", key) == expected
        if expected:
            self._began(key)

    @precondition(lambda self: self.begin_asked)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self._finish(data.draw(st.sampled_from(sorted(self.begin_asked))))

    @rule(index=st.integers(0, len(ROOMS) - 1), write_fails=st.booleans())
    def stop(self, index: int, write_fails: bool) -> None:
        """``!stop``; if recording the drop fails, the service puts the messages back."""
        key = ROOMS[index]
        before = self.scheduler.status(key)
        result = self._do("stop", key)
        unbegun = self.inflight[key]
        if key in self.offered:
            self.stale.append((key, self.offered.pop(key)))  # dropped with the rest
        if key in self.running:
            # A stop also wins over an interrupt that is still winding the run
            # down: the user said stop, so the run is not offered for !retry.
            self.stopping[key] = EndReason.STOPPED
        expected = before.running if key in self.began and not before.stopping else None
        assert result.stopped == expected
        # A batch that had not begun is dropped first, then the queue.
        assert list(result.dropped[: len(unbegun)]) == unbegun
        self.inflight[key] = []
        self.outputs[key] += result.dropped
        self.windows.pop(key, None)
        for tier in self.slot_queue:
            tier.discard(key)
        after = self.scheduler.status(key)
        assert after.waiting == 0
        assert not after.waiting_for_slot
        assert after.running == before.running  # the run keeps its slot until it ends
        if key in self.running:
            assert self.scheduler.cancel_reason(key) is EndReason.STOPPED
        if write_fails and result.dropped:
            n = len(result.dropped)
            assert self.outputs[key][-n:] == list(result.dropped)
            del self.outputs[key][-n:]
            if key not in self.running:
                window = self.windows[key] = Window(self.now)
                window.count = n
            self._do("restore", key, result.dropped, self.now)
            self._check_windows()

    @precondition(lambda self: any(r.by_shutdown for r in self.stopping.values()))
    @rule(data=st.data(), write_fails=st.booleans())
    def stop_a_run_cut_off(self, data: st.DataObject, write_fails: bool) -> None:
        """``!stop`` of a run a drain is interrupting or detaching (rare by chance alone)."""
        cut_off = sorted(k for k, r in self.stopping.items() if r.by_shutdown)
        self.stop(ROOMS.index(data.draw(st.sampled_from(cut_off))), write_fails)

    @rule()
    def drain(self) -> None:
        self.draining = True
        self._do("drain")
        for key in ROOMS:
            if self.inflight[key]:
                self.inflight[key] = []  # back in front of the queue
        self._check_windows()

    @precondition(lambda self: self.draining)
    @rule(reason=st.sampled_from([EndReason.INTERRUPTED, EndReason.DETACHED]))
    def interrupt(self, reason: EndReason) -> None:
        """The grace ended: cut the begun runs off, interrupting or detaching them."""
        cancelled = self._do("interrupt", reason)
        expected = sorted(k for k in self.began if k in self.running and k not in self.stopping)
        assert [b.room for b in cancelled] == expected
        for key in expected:
            self.stopping[key] = reason
        for key, why in self.stopping.items():
            assert self.scheduler.cancel_reason(key) is why

    @rule(data=st.data(), index=st.integers(0, len(ROOMS) - 1))
    def edit(self, data: st.DataObject, index: int) -> None:
        key = ROOMS[index]
        if not self.submitted[key]:
            return
        target = data.draw(st.sampled_from(self.submitted[key]))
        self.edits += 1
        edited = replace(target, text=f"edit {self.edits}")
        waiting = self._waiting_from(key)
        position = next(
            (
                i
                for i in range(waiting, len(self.submitted[key]))
                if self.submitted[key][i].id == target.id
            ),
            None,
        )
        assert self._do("replace", edited) == (position is not None)
        if position is not None:
            self.submitted[key][position] = edited

    @rule(data=st.data(), index=st.integers(0, len(ROOMS) - 1))
    def delete(self, data: st.DataObject, index: int) -> None:
        key = ROOMS[index]
        if not self.submitted[key]:
            return
        target = data.draw(st.sampled_from(self.submitted[key]))
        waiting = self._waiting_from(key)
        position = next(
            (
                i
                for i in range(waiting, len(self.submitted[key]))
                if self.submitted[key][i].id == target.id
            ),
            None,
        )
        assert self._do("remove", target, self.now) == (position is not None)
        if position is not None:
            del self.submitted[key][position]
            if key in self.windows:
                self.windows[key].count -= 1
            status = self.scheduler.status(key)
            if not gathering(status):
                self.windows.pop(key, None)
            if not status.waiting_for_slot:
                for tier in self.slot_queue:
                    tier.discard(key)

    @rule(index=st.integers(0, len(ROOMS) - 1), mode=MODES)
    def set_mode(self, index: int, mode: DuringRun) -> None:
        """The room's configuration changes between messages."""
        self.modes[ROOMS[index]] = mode

    @precondition(lambda self: self.offered)
    @rule(data=st.data(), taken=st.booleans())
    def answer(self, data: st.DataObject, taken: bool) -> None:
        """The run answers the steer offer: it took the messages, or takes no input."""
        key = data.draw(st.sampled_from(sorted(self.offered)))
        batch = self.offered.pop(key)
        twin_batch = self.twin.offered(key)
        assert twin_batch == batch
        assert self.scheduler.offered(key) is batch
        before = self.scheduler.status(key)
        actions = self.scheduler.steer_answered(key, batch, taken, self.now)
        assert twin_batch is not None
        twin = self.twin.steer_answered(key, twin_batch, taken, self.now)
        assert runs_and_steers(actions) == runs_and_steers(twin)
        after = self.scheduler.status(key)
        if taken:
            self.outputs[key] += batch.messages
            assert after.steered == before.steered + len(batch.messages)
            assert after.waiting == before.waiting - len(batch.messages)
        else:
            assert after.waiting == before.waiting
            assert after.steering == 0  # everything not taken queues now
        self._actions("steer_answered", actions)

    @precondition(lambda self: self.stale)
    @rule(data=st.data(), taken=st.booleans())
    def answer_too_late(self, data: st.DataObject, taken: bool) -> None:
        """An answer to an offer the room no longer has changes nothing."""
        key, batch = data.draw(st.sampled_from(self.stale))
        before = self.scheduler.status(key)
        assert self.scheduler.steer_answered(key, batch, taken, self.now) == []
        assert self.scheduler.status(key) == before

    # -- invariants ----------------------------------------------------------

    @invariant()
    def cap_and_serial_lock(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        # Granted only below the cap, counting adopted runs: see _started.
        assert len(self.running) - len(self.adopted) <= self.limits.max_concurrent_runs
        assert self.scheduler.active_runs == len(self.running)
        for key in ROOMS:
            assert self.scheduler.status(key).running == self.running.get(key)

    @invariant()
    def no_idle_slot_while_a_room_waits(self) -> None:
        if not hasattr(self, "scheduler") or self.draining:
            return
        if any(self._short(k) for k in ROOMS):
            # Adopted runs may hold more slots than the cap; before serving there are none.
            capacity = self.limits.max_concurrent_runs if self.serving else 0
            assert len(self.running) >= capacity

    @invariant()
    def exactly_once_in_order(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        queued = 0
        for key in ROOMS:
            out, sub = self.outputs[key], self.submitted[key]
            waiting = self.scheduler.status(key).waiting
            inflight = self.inflight[key]
            assert out + inflight == sub[: len(out) + len(inflight)]
            assert len(out) + len(inflight) + waiting == len(sub)
            queued += waiting
        assert self.scheduler.queued == queued
        busy = [k for k in ROOMS if self.scheduler.status(k) != RoomStatus()]
        assert self.scheduler.room_count == len(busy)

    @invariant()
    def open_windows_have_not_closed(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        for key in ROOMS:
            is_gathering = gathering(self.scheduler.status(key))
            assert is_gathering == (key in self.windows)
            if is_gathering:
                assert self.now < self.windows[key].closes(self.limits)

    @invariant()
    def prestarts_are_accounted_for(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        assert self.scheduler.prestarts == len(self.held) <= self.max_prestarts
        assert self.prestarts_begun == self.prestarts_ended + len(self.held) + len(self.carried)
        for key in ROOMS:
            assert self.scheduler.holds_prestart(key) == (key in self.held | self.carried)
            assert self.scheduler.offered(key) == self.offered.get(key)
        assert not self.held & set(self.running)
        assert self.carried <= set(self.running) - self.began
        waiting = {k for k in ROOMS if self.scheduler.status(k).waiting_for_slot}
        if any(self._short(k) for k in waiting) and not self.draining:
            assert self.held <= waiting, "a prestart holds budget while a room waits"
        if self.draining:
            assert not self.held
            assert not self.carried

    def teardown(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        if not self.serving:
            self.serve()
        for _ in range(10_000):
            if self.scheduler.room_count == 0:
                break
            if self.running:
                self.finish_all()
            elif self.draining:
                break  # nothing begins: what waits stays (pending for the restart)
            else:
                self.advance(3.0)
        assert self.scheduler.active_runs == 0
        for key in ROOMS:
            out, sub = self.outputs[key], self.submitted[key]
            assert out == sub[: len(out)]
            assert len(out) + self.scheduler.status(key).waiting == len(sub)
            if not self.draining:
                assert out == sub
        if not self.draining:
            assert self.scheduler.queued == 0
        assert not self.held
        assert not self.carried
        assert self.prestarts_begun == self.prestarts_ended

    # -- helpers -------------------------------------------------------------

    def finish_all(self) -> None:
        for key in sorted(self.running):
            if key in self.running:
                if key not in self.begin_asked:
                    self.begin_asked.add(key)
                    if self._do("begin", key):
                        self._began(key)
                for offered in list(self.offered):
                    self.answer_offer(offered)
                self._finish(key)

    def _finish(self, key: RoomKey) -> None:
        del self.running[key]
        self.adopted.discard(key)
        self.begin_asked.discard(key)
        self.began.discard(key)
        self.stopping.pop(key, None)
        if key in self.offered:
            self.stale.append((key, self.offered.pop(key)))  # queued again, in front
        self._do("run_finished", key, self.now)
        self._check_windows()

    def answer_offer(self, key: RoomKey) -> None:
        """Teardown: the run takes what it is offered."""
        batch = self.offered.pop(key)
        self.outputs[key] += batch.messages
        twin_batch = self.twin.offered(key)
        assert twin_batch is not None
        actions = self.scheduler.steer_answered(key, batch, True, self.now)
        assert runs_and_steers(actions) == runs_and_steers(
            self.twin.steer_answered(key, twin_batch, True, self.now)
        )
        self._actions("steer_answered", actions)

    def _began(self, key: RoomKey) -> None:
        self.began.add(key)
        self.outputs[key] += self.inflight[key]
        self.inflight[key] = []
        if key in self.carried:
            self.carried.discard(key)  # consumed: execute takes it
            self.prestarts_ended += 1

    def _do(self, name: str, *args: Any) -> Any:
        """Call the scheduler and its twin without prestarts alike; carry out the actions."""
        result = getattr(self.scheduler, name)(*args)
        twin = getattr(self.twin, name)(*args)
        if name in CANCELS or name in ("set_capacity", "steer_answered"):
            actions: list[Action] = result if isinstance(result, list) else []
            twin_actions: list[Action] = twin if isinstance(twin, list) else []
            actions = actions + self.scheduler.take_actions()
            twin_actions = twin_actions + self.twin.take_actions()
            assert runs_and_steers(actions) == runs_and_steers(twin_actions)
            self._actions(name, actions)
        if not isinstance(result, list) or name == "interrupt":
            assert result == twin
        return result

    def _waiting_from(self, key: RoomKey) -> int:
        """Index in ``submitted`` of the room's first message that can change (edit, delete):
        offered steer messages are with the run already."""
        offered = self.offered.get(key)
        return (
            len(self.outputs[key])
            + len(self.inflight[key])
            + (0 if offered is None else len(offered.messages))
        )

    def _submit(self, message: Message) -> None:
        key = message.room
        before = self.scheduler.status(key)
        if before == RoomStatus():
            self.windows[key] = Window(self.now)
        elif gathering(before):
            window = self.windows[key]
            window.last = self.now
            window.count += 1
        self.submitted[key].append(message)
        self._do("submit", message, self.now)
        self._check_windows()

    def _actions(self, event: str, actions: list[Action]) -> None:
        """Check and record what ``event`` decided, in order."""
        started: list[Batch] = []
        for action in actions:
            match action:
                case StartRun(batch, prestarted):
                    assert prestarted == (batch.room in self.held)
                    if prestarted:
                        self.held.discard(batch.room)
                        self.carried.add(batch.room)
                    started.append(batch)
                case SteerRun(batch):
                    self._offered(batch)
                case BeginPrestart(key):
                    assert key not in self.held | self.carried
                    assert gathering(self.scheduler.status(key))
                    assert not any(self.scheduler.status(k).waiting_for_slot for k in ROOMS)
                    self.held.add(key)
                    self.prestarts_begun += 1
                    assert len(self.held) <= self.max_prestarts
                    assert len(self.running) + len(started) + len(self.held) <= (
                        self.scheduler.capacity
                    )
                case CancelPrestart(key, why):
                    assert why in CANCELS.get(event, set()), f"{why} cancelled at {event}"
                    assert key in self.held | self.carried
                    self.held.discard(key)
                    self.carried.discard(key)
                    self.prestarts_ended += 1
                    if why is PrestartCancel.SLOT_NEEDED:
                        assert not self.scheduler.status(key).waiting_for_slot
                        assert self.scheduler.waiting_for_slot
                    if why is PrestartCancel.IDLE:
                        assert self.scheduler.status(key) == RoomStatus()
        self._started(started)

    def _offered(self, batch: Batch) -> None:
        """A steer batch: the room's oldest messages not in a run, for its begun run."""
        key = batch.room
        assert key not in self.offered, "two steer offers at once"
        assert key in self.began
        assert key not in self.stopping
        assert not self.draining
        assert not self.inflight[key]
        assert 1 <= len(batch.messages) <= self.limits.max_batch
        # Only the run's thread steers it: its answers go there.
        assert {m.thread for m in batch.messages} == {self.running[key].first.thread}
        start = len(self.outputs[key])
        assert list(batch.messages) == self.submitted[key][start : start + len(batch.messages)]
        self.offered[key] = batch

    def _started(self, batches: list[Batch]) -> None:
        for batch in batches:
            assert not self.draining, "a run was granted while draining"
            assert batch.room not in self.running, f"two runs in {batch.room}"
            self._check_fifo(batch.room)
            assert 1 <= len(batch.messages) <= self.limits.max_batch
            assert len({m.thread for m in batch.messages}) == 1, "a batch mixes threads"
            self.running[batch.room] = batch
            self.inflight[batch.room] = list(batch.messages)
        if batches:
            # Runs are granted only below the cap, adopted ones counted as running.
            assert len(self.running) <= self.limits.max_concurrent_runs

    def _cap_of(self, channel: RoomKey) -> int | None:
        return self.room_cap

    def _room_full(self, key: RoomKey) -> bool:
        """``key``'s room runs as many conversations as its cap allows."""
        held = sum(1 for k in self.running if k.channel == key.channel)
        return self.room_cap is not None and held >= self.room_cap

    def _short(self, key: RoomKey) -> bool:
        """``key`` waits for want of a slot (not for its room's cap)."""
        return self.scheduler.status(key).waiting_for_slot and not self._room_full(key)

    def _check_fifo(self, key: RoomKey) -> None:
        """``key`` got a slot: nobody who has waited longer may still be waiting."""
        self.slot_queue = [tier for tier in self.slot_queue if tier]
        for tier in self.slot_queue:
            if key in tier:
                tier.discard(key)
                return
            # A conversation whose room is at its cap is passed over, keeping its place.
            passed = {k for k in tier if not self._room_full(k)}
            assert not passed, f"{key} got a slot before {sorted(passed)}, who waited longer"

    def _check_windows(self) -> None:
        """A room that left gathering did so for a reason the rules allow."""
        for key, window in list(self.windows.items()):
            if gathering(self.scheduler.status(key)):
                continue
            full = window.count >= self.limits.max_batch
            assert full or self.now >= window.closes(self.limits), (
                f"{key} flushed at {self.now}, window closes at {window.closes(self.limits)}"
            )
            del self.windows[key]
        queued = set().union(*self.slot_queue)
        new = {k for k in ROOMS if self.scheduler.status(k).waiting_for_slot} - queued
        if new:
            self.slot_queue.append(new)


SchedulerMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_scheduler_properties = SchedulerMachine.TestCase

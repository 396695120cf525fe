"""Property tests: random schedules against the pure scheduler (rooms + slots + timers).

A hypothesis state machine submits, re-submits, moves time, finishes runs,
stops rooms, adopts runs already going (before the scheduler serves, as at a
restart, and while it serves) and drains (interrupting or detaching), and
checks after every step:

- never two runs in one room; the cap is never exceeded by the runs the
  scheduler grants itself, counting adopted runs as running (an adoption
  alone may go beyond it); a room with a run adopts none, and nothing is
  adopted while draining;
- no room waits for a slot while a slot is free, and slots go to waiting
  rooms in the order they became ready (rooms that became ready at the same
  step may go in either order);
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

At the end it finishes everything and checks every message ran or was
dropped, or (after a drain) still waits.
"""

from __future__ import annotations

from dataclasses import replace

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
from dispatcher.scheduler import Scheduler
from dispatcher.status import EndReason, RoomStatus
from tests.dispatcher.fakes import Messages, room

ROOMS = [room(i) for i in range(4)]
# Multiples of 1/4 add up exactly in binary floating point, so the test's
# deadlines and the scheduler's are the same numbers.
STEPS = st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 3.0])


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

    @initialize(
        coalesce=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
        max_wait=st.sampled_from([0.0, 1.0, 3.0]),
        max_batch=st.integers(1, 4),
        cap=st.integers(1, 3),
        serving=st.booleans(),
    )
    def setup(
        self, coalesce: float, max_wait: float, max_batch: int, cap: int, serving: bool
    ) -> None:
        self.limits = DispatchLimits(coalesce, max_wait, max_batch, cap)
        # Not serving yet, as the driver starts: no slots, so runs can only be adopted.
        self.scheduler = Scheduler(self.limits, capacity=None if serving else 0)
        self.serving = serving

    # -- rules ---------------------------------------------------------------

    @rule(index=st.integers(0, len(ROOMS) - 1))
    def submit(self, index: int) -> None:
        self._submit(self.make(ROOMS[index]))

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
        self._started(self.scheduler.set_capacity(self.limits.max_concurrent_runs, self.now))
        self._check_windows()

    @rule(index=st.integers(0, len(ROOMS) - 1), size=st.integers(1, 3))
    def adopt(self, index: int, size: int) -> None:
        """A run an earlier process started, reattached: it becomes the room's run."""
        key = ROOMS[index]
        batch = Batch(key, tuple(self.make(key) for _ in range(size)))
        before = self.scheduler.status(key)
        if self.draining:
            with pytest.raises(RuntimeError, match="draining"):
                self.scheduler.adopt(batch, self.now)
            assert self.scheduler.status(key) == before
            return
        if key in self.running:
            with pytest.raises(ValueError, match="already has a run"):
                self.scheduler.adopt(batch, self.now)
            assert self.scheduler.status(key) == before
            return
        self.scheduler.adopt(batch, self.now)
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
            self._started(self.scheduler.fire_timers(self.now))
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
        assert self.scheduler.begin(key) == expected
        if expected:
            self.began.add(key)
            self.outputs[key] += self.inflight[key]
            self.inflight[key] = []

    @precondition(lambda self: self.begin_asked)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self._finish(data.draw(st.sampled_from(sorted(self.begin_asked))))

    @rule(index=st.integers(0, len(ROOMS) - 1), write_fails=st.booleans())
    def stop(self, index: int, write_fails: bool) -> None:
        """``!stop``; if recording the drop fails, the service puts the messages back."""
        key = ROOMS[index]
        before = self.scheduler.status(key)
        result = self.scheduler.stop(key)
        unbegun = self.inflight[key]
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
            self._started(self.scheduler.restore(key, result.dropped, self.now))
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
        self.scheduler.drain()
        for key in ROOMS:
            if self.inflight[key]:
                self.inflight[key] = []  # back in front of the queue
        self._check_windows()

    @precondition(lambda self: self.draining)
    @rule(reason=st.sampled_from([EndReason.INTERRUPTED, EndReason.DETACHED]))
    def interrupt(self, reason: EndReason) -> None:
        """The grace ended: cut the begun runs off, interrupting or detaching them."""
        cancelled = self.scheduler.interrupt(reason)
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
        assert self.scheduler.replace(edited) == (position is not None)
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
        assert self.scheduler.remove(target, self.now) == (position is not None)
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
        if any(self.scheduler.status(k).waiting_for_slot for k in ROOMS):
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

    # -- helpers -------------------------------------------------------------

    def finish_all(self) -> None:
        for key in sorted(self.running):
            if key in self.running:
                if key not in self.begin_asked:
                    self.begin_asked.add(key)
                    if self.scheduler.begin(key):
                        self.began.add(key)
                        self.outputs[key] += self.inflight[key]
                        self.inflight[key] = []
                self._finish(key)

    def _finish(self, key: RoomKey) -> None:
        del self.running[key]
        self.adopted.discard(key)
        self.begin_asked.discard(key)
        self.began.discard(key)
        self.stopping.pop(key, None)
        self._started(self.scheduler.run_finished(key, self.now))
        self._check_windows()

    def _waiting_from(self, key: RoomKey) -> int:
        """Index in ``submitted`` of the room's first waiting message."""
        return len(self.outputs[key]) + len(self.inflight[key])

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
        self._started(self.scheduler.submit(message, self.now))
        self._check_windows()

    def _started(self, batches: list[Batch]) -> None:
        for batch in batches:
            assert not self.draining, "a run was granted while draining"
            assert batch.room not in self.running, f"two runs in {batch.room}"
            self._check_fifo(batch.room)
            assert 1 <= len(batch.messages) <= self.limits.max_batch
            self.running[batch.room] = batch
            self.inflight[batch.room] = list(batch.messages)
        if batches:
            # Runs are granted only below the cap, adopted ones counted as running.
            assert len(self.running) <= self.limits.max_concurrent_runs

    def _check_fifo(self, key: RoomKey) -> None:
        """``key`` got a slot: nobody who has waited longer may still be waiting."""
        self.slot_queue = [tier for tier in self.slot_queue if tier]
        for tier in self.slot_queue:
            if key in tier:
                tier.discard(key)
                return
            assert not tier, f"{key} got a slot before {sorted(tier)}, who waited longer"

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

"""The per-room state machine, with explicit times."""

from __future__ import annotations

import pytest

from bridge.core.model import Batch, Message
from dispatcher.limits import DispatchLimits
from dispatcher.room import (
    REQUEST_SLOT,
    ArmTimer,
    CancelRun,
    Dropped,
    Phase,
    ReleaseSlot,
    RequestSlot,
    Restated,
    Room,
    SkipRun,
    StartRun,
    TakeSlot,
    WithdrawSlotRequest,
)
from dispatcher.status import EndReason
from tests.dispatcher.fakes import Messages, room

LIMITS = DispatchLimits(coalesce_s=1.0, max_wait_s=5.0, max_batch=3, max_concurrent_runs=2)
KEY = room("a")


def phase(r: Room) -> Phase:
    """Read afresh: mypy would keep ``r.phase`` narrowed across events."""
    return r.phase


def cancel_reason(r: Room) -> EndReason | None:
    """Read afresh, as :func:`phase`."""
    return r.cancel_reason


@pytest.fixture
def make() -> Messages:
    return Messages()


def test_first_message_opens_a_batch_and_arms_the_window(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    assert r.message(make(KEY), now=10.0) == [ArmTimer(11.0)]
    assert phase(r) is Phase.GATHERING
    assert r.deadline == 11.0


def test_each_message_restarts_the_window_and_an_early_tick_rearms(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    r.message(make(KEY), now=10.0)
    assert r.message(make(KEY), now=10.5) == []  # the armed timer is reused
    assert r.tick(11.0) == [ArmTimer(11.5)]
    assert phase(r) is Phase.GATHERING
    assert r.tick(11.5) == [RequestSlot()]
    assert phase(r) is Phase.READY


def test_a_tick_before_the_armed_time_is_stale(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    r.message(make(KEY), now=0.0)
    assert r.tick(0.5) == []
    assert phase(r) is Phase.GATHERING


def test_max_wait_caps_the_window(make: Messages) -> None:
    limits = DispatchLimits(coalesce_s=1.0, max_wait_s=2.5, max_batch=99, max_concurrent_runs=1)
    r = Room(KEY, limits)
    r.message(make(KEY), now=0.0)
    r.message(make(KEY), now=0.8)
    assert r.tick(1.0) == [ArmTimer(1.8)]
    r.message(make(KEY), now=1.6)
    assert r.tick(1.8) == [ArmTimer(2.5)]  # 1.6 + 1.0 is past the max wait
    r.message(make(KEY), now=2.4)
    assert r.tick(2.5) == [REQUEST_SLOT]


def test_the_window_counts_from_when_a_message_arrived(make: Messages) -> None:
    # Recording it took 0.3 s: the user has waited that long already.
    r = Room(KEY, LIMITS)
    assert r.message(make(KEY), now=10.3, arrived=10.0) == [ArmTimer(11.0)]
    assert r.deadline == 11.0
    # A message recorded later than it came, but after the last one: the window moves.
    assert r.message(make(KEY), now=10.6, arrived=10.4) == []
    assert r.deadline == 11.4


def test_a_late_recorded_message_never_moves_the_window_back(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    r.message(make(KEY), now=10.5)
    # Came before the batch's last message, recorded after it.
    assert r.message(make(KEY), now=10.6, arrived=10.2) == []
    assert r.deadline == 11.5
    # "Arrived" after it was handed over is not believed: it counts from then.
    r = Room(KEY, LIMITS)
    assert r.message(make(KEY), now=10.7, arrived=99.0) == [ArmTimer(11.7)]


def test_a_message_whose_window_passed_while_it_was_recorded_is_due_at_once(
    make: Messages,
) -> None:
    r = Room(KEY, LIMITS)
    assert r.message(make(KEY), now=12.0, arrived=10.0) == [REQUEST_SLOT]
    assert phase(r) is Phase.READY


def test_max_batch_makes_the_room_ready_at_once(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    r.message(make(KEY), now=0.0)
    r.message(make(KEY), now=0.1)
    assert r.message(make(KEY), now=0.2) == [REQUEST_SLOT]
    assert phase(r) is Phase.READY
    assert r.tick(1.2) == []  # the window's timer is moot now


def test_ready_room_keeps_gathering_and_runs_the_first_max_batch(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    msgs = [make(KEY) for _ in range(5)]
    for m in msgs:
        r.message(m, now=0.0)
    assert r.pending == 5
    [start] = r.slot_granted(now=2.0)
    assert isinstance(start, StartRun)
    assert start.batch.messages == tuple(msgs[:3])
    assert (r.run, r.run_since, r.pending) == (start.batch, 2.0, 2)


def test_messages_during_a_run_queue_and_go_at_once_when_it_ends(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    first = make(KEY)
    r.message(first, now=0.0)
    r.tick(1.0)
    r.slot_granted(now=1.0)
    assert r.message(make(KEY), now=2.0) == []  # no timer: queued
    assert phase(r) is Phase.RUNNING
    assert r.run_finished(now=3.0) == [ReleaseSlot(), RequestSlot()]
    assert phase(r) is Phase.READY


def test_a_run_without_queue_leaves_the_room_idle(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    r.message(make(KEY), now=0.0)
    r.tick(1.0)
    r.slot_granted(now=1.0)
    assert r.run_finished(now=2.0) == [ReleaseSlot()]
    assert r.idle
    assert phase(r) is Phase.IDLE


def test_stop_cancels_the_run_once_and_drops_the_queue(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    r.message(make(KEY), now=0.0)
    r.tick(1.0)
    [start] = r.slot_granted(now=1.0)
    assert isinstance(start, StartRun)
    assert r.begin()
    queued = make(KEY)
    r.message(queued, now=1.5)
    assert r.stop() == [CancelRun(start.batch, EndReason.STOPPED), Dropped((queued,))]
    assert r.stopping
    assert r.cancel_reason is EndReason.STOPPED
    assert r.stop() == []  # already winding down
    late = make(KEY)
    assert r.message(late, now=2.0) == []  # queued behind the winding-down run
    assert r.run_finished(now=3.0) == [ReleaseSlot(), RequestSlot()]
    assert not r.stopping


def test_stop_while_ready_withdraws_the_slot_request(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    m = make(KEY)
    r.message(m, now=0.0)
    r.tick(1.0)
    assert r.stop() == [WithdrawSlotRequest(), Dropped((m,))]
    assert r.idle


def test_stop_while_gathering_forgets_the_window(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    m = make(KEY)
    r.message(m, now=0.0)
    assert r.stop() == [Dropped((m,))]
    assert r.idle
    assert r.tick(1.0) == []


def test_events_out_of_order_are_bugs(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    with pytest.raises(RuntimeError, match="did not ask"):
        r.slot_granted(now=0.0)
    with pytest.raises(RuntimeError, match="no run"):
        r.run_finished(now=0.0)


def granted(r: Room, make: Messages, n: int = 1) -> StartRun:
    for i in range(n):
        r.message(make(KEY), now=0.0 + i * 0.1)
    r.tick(5.0)
    [start] = r.slot_granted(now=5.0)
    assert isinstance(start, StartRun)
    return start


def test_stop_before_the_run_began_drops_its_batch_first(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    start = granted(r, make, 2)
    queued = make(KEY)
    r.message(queued, now=6.0)
    assert r.stop() == [
        SkipRun(start.batch, dropped=True),
        Dropped((*start.batch.messages, queued)),
    ]
    assert not r.begin()  # the owner never carries it out
    assert r.stop() == []
    assert r.run_finished(now=7.0) == [ReleaseSlot()]
    assert r.idle


def test_drain_puts_a_run_that_has_not_begun_back_in_front(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    start = granted(r, make, 2)
    queued = make(KEY)
    r.message(queued, now=6.0)
    assert r.drain() == [SkipRun(start.batch, dropped=False)]
    assert not r.begin()
    assert r.pending == 3
    assert r.interrupt() == []  # nothing began: nothing to cancel
    assert r.run_finished(now=7.0) == [ReleaseSlot(), RequestSlot()]
    [again] = r.slot_granted(now=8.0)
    assert isinstance(again, StartRun)
    assert again.batch.messages == (*start.batch.messages, queued)


def test_drain_leaves_a_begun_run_alone_and_interrupt_cancels_it_once(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    start = granted(r, make)
    assert r.begin()
    assert r.drain() == []
    assert r.interrupt() == [CancelRun(start.batch, EndReason.INTERRUPTED)]
    assert r.interrupt() == []
    assert r.cancel_reason is EndReason.INTERRUPTED


def test_interrupt_keeps_the_reason_of_a_stop(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    granted(r, make)
    assert r.begin()
    r.stop()
    assert r.interrupt() == []
    assert r.cancel_reason is EndReason.STOPPED


def test_restore_puts_dropped_messages_back_in_front(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    start = granted(r, make)
    assert r.begin()
    dropped = make(KEY)
    r.message(dropped, now=6.0)
    r.stop()
    later = make(KEY)
    r.message(later, now=6.5)
    assert r.restore((dropped,), now=7.0) == []  # behind the winding-down run
    r.run_finished(now=8.0)
    [again] = r.slot_granted(now=8.0)
    assert isinstance(again, StartRun)
    assert again.batch.messages == (dropped, later)
    assert start.batch.messages != again.batch.messages


def test_restore_into_an_idle_room_opens_a_window(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    m = make(KEY)
    assert r.restore((m,), now=3.0) == [ArmTimer(4.0)]
    assert phase(r) is Phase.GATHERING


def test_replace_and_remove_touch_only_waiting_messages(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    start = granted(r, make)
    in_run = start.batch.first
    waiting = make(KEY)
    r.message(waiting, now=6.0)
    edited = Message(
        id=waiting.id,
        room=KEY,
        sender=waiting.sender,
        text="edited",
        external_id=waiting.external_id,
        received_at=0.0,
    )
    assert r.replace(edited)
    assert not r.replace(Message(in_run.id, KEY, in_run.sender, "x", in_run.external_id, 0.0))
    assert r.remove(in_run, 0.0) == (False, [])
    assert r.remove(edited, 0.0) == (True, [])
    assert r.remove(edited, 0.0) == (False, [])  # a duplicate deletion
    assert r.pending == 0


def test_removing_the_last_waiting_message_gives_up_the_slot_request(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    m = make(KEY)
    r.message(m, now=0.0)
    r.tick(1.0)
    assert r.ready
    assert r.remove(m, 0.0) == (True, [WithdrawSlotRequest()])
    assert r.idle
    assert r.tick(2.0) == []


def test_a_stop_while_an_interrupted_run_winds_down_makes_it_stopped(make: Messages) -> None:
    """Shutdown cut the run off, then the room said stop: the user's word wins.

    The run is not cancelled twice; it ends as stopped, so it is not offered
    for ``!retry`` as an interrupted run would be.
    """
    r = Room(KEY, DispatchLimits(1.0, 5.0, max_batch=1, max_concurrent_runs=1))
    r.message(make(KEY), now=0.0)
    (batch,) = [e.batch for e in r.slot_granted(0.0) if isinstance(e, StartRun)]
    assert r.begin()
    assert r.interrupt() == [CancelRun(batch, EndReason.INTERRUPTED)]
    assert r.stop() == [Restated(batch, EndReason.STOPPED)]
    assert r.cancel_reason is EndReason.STOPPED
    assert r.interrupt() == []
    assert r.stop() == []


def test_a_stop_while_a_detached_run_winds_down_makes_it_stopped(make: Messages) -> None:
    """A shutdown that leaves the run to its supervisor, then the room says stop:
    the run is stopped after all, not left running."""
    r = Room(KEY, LIMITS)
    start = granted(r, make)
    assert r.begin()
    assert r.interrupt(EndReason.DETACHED) == [CancelRun(start.batch, EndReason.DETACHED)]
    assert r.interrupt(EndReason.INTERRUPTED) == []  # cut off once, for the first reason
    assert cancel_reason(r) is EndReason.DETACHED
    assert r.stop() == [Restated(start.batch, EndReason.STOPPED)]
    assert cancel_reason(r) is EndReason.STOPPED


def test_a_shutdown_does_not_stop_runs(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    granted(r, make)
    assert r.begin()
    with pytest.raises(ValueError, match="stopped"):
        r.interrupt(EndReason.STOPPED)
    assert r.cancel_reason is None


def adopted_batch(make: Messages, n: int = 1) -> Batch:
    """The batch of a run an earlier process started."""
    return Batch(KEY, tuple(make(KEY) for _ in range(n)))


def test_an_adopted_run_has_begun_and_takes_a_slot(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    batch = adopted_batch(make, 2)
    assert r.adopt(batch, now=3.0) == [TakeSlot()]
    assert phase(r) is Phase.RUNNING
    assert (r.run, r.run_since, r.began) == (batch, 3.0, True)
    assert r.begin()  # its task may carry it on
    assert r.drain() == []  # a drain does not put it back: it is going
    assert r.interrupt(EndReason.DETACHED) == [CancelRun(batch, EndReason.DETACHED)]


def test_messages_waiting_when_a_run_is_adopted_queue_behind_it(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    gathered = make(KEY)
    r.message(gathered, now=0.0)  # window armed for 1.0
    batch = adopted_batch(make)
    assert r.adopt(batch, now=0.5) == [TakeSlot()]
    assert r.tick(1.0) == []  # the window no longer matters
    later = make(KEY)
    assert r.message(later, now=2.0) == []
    assert r.run_finished(now=9.0) == [ReleaseSlot(), RequestSlot()]
    [follow_up] = r.slot_granted(now=9.0)
    assert follow_up == StartRun(Batch(KEY, (gathered, later)))


def test_adopting_gives_up_a_slot_request(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    waiting = [make(KEY) for _ in range(3)]  # max_batch: ready at once
    for m in waiting:
        r.message(m, now=0.0)
    assert r.ready
    assert r.adopt(adopted_batch(make), now=0.0) == [WithdrawSlotRequest(), TakeSlot()]
    assert not r.ready
    assert r.pending == 3


def test_an_adopted_run_is_stopped_like_any_run(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    batch = adopted_batch(make)
    r.adopt(batch, now=0.0)
    queued = make(KEY)
    r.message(queued, now=1.0)
    assert r.stop() == [CancelRun(batch, EndReason.STOPPED), Dropped((queued,))]
    assert r.run_finished(now=2.0) == [ReleaseSlot()]
    assert r.idle


def test_a_room_with_a_run_adopts_none(make: Messages) -> None:
    r = Room(KEY, LIMITS)
    granted(r, make)  # granted, not begun
    with pytest.raises(ValueError, match="already has a run"):
        r.adopt(adopted_batch(make), now=6.0)
    assert r.begin()
    with pytest.raises(ValueError, match="already has a run"):
        r.adopt(adopted_batch(make), now=6.0)
    with pytest.raises(ValueError, match="adopted by room"):
        Room(KEY, LIMITS).adopt(Batch(room("b"), (make(room("b")),)), now=6.0)


def test_a_batch_never_mixes_threads(make: Messages) -> None:
    """A run takes the leading messages of one thread; the next thread's head the
    queue, ready as soon as the run ends (no new window)."""
    r = Room(KEY, LIMITS)
    top, in_thread, top_again = make(KEY, "a"), make(KEY, "b", thread="t1"), make(KEY, "c")
    r.message(top, now=0.0)
    r.message(in_thread, now=0.1)
    assert r.message(top_again, now=0.2) == [REQUEST_SLOT]  # max_batch reached
    [first] = r.slot_granted(0.2)
    assert isinstance(first, StartRun)
    assert first.batch.messages == (top,)
    assert r.pending == 2
    assert r.begin()
    assert r.run_finished(1.0) == [ReleaseSlot(), RequestSlot()]
    [second] = r.slot_granted(1.0)
    assert isinstance(second, StartRun)
    assert second.batch.messages == (in_thread,)
    assert r.begin()
    assert r.run_finished(2.0) == [ReleaseSlot(), RequestSlot()]
    [third] = r.slot_granted(2.0)
    assert isinstance(third, StartRun)
    assert third.batch.messages == (top_again,)

"""During-run modes: steer batches for the running run, rule by rule (room and scheduler)."""

from __future__ import annotations

import pytest

from bridge.core.model import Batch, Message
from dispatcher.limits import DispatchLimits
from dispatcher.policy import DuringRun
from dispatcher.room import (
    ArmTimer,
    CancelRun,
    Dropped,
    Effect,
    ReleaseSlot,
    RequestSlot,
    Room,
    SkipRun,
    StartRun,
    SteerRun,
)
from dispatcher.scheduler import Action, Scheduler
from dispatcher.status import EndReason, StopResult
from tests.dispatcher.fakes import Messages, room

LIMITS = DispatchLimits(coalesce_s=1.0, max_wait_s=5.0, max_batch=3, max_concurrent_runs=2)
KEY = room("a")
STEER = DuringRun.STEER


@pytest.fixture
def make() -> Messages:
    return Messages()


def running(make: Messages, *, begun: bool = True) -> tuple[Room, Batch]:
    """A room whose run of one message was granted at 0 (and has begun)."""
    r = Room(KEY, LIMITS)
    r.message(make(KEY), now=0.0)
    r.tick(1.0)
    batch = started(r.slot_granted(1.0))
    if begun:
        assert r.begin()
    return r, batch


def started(effects: list[Effect] | list[Action]) -> Batch:
    [effect] = effects
    assert isinstance(effect, StartRun)
    return effect.batch


def offered(effects: list[Effect] | list[Action]) -> Batch:
    [effect] = effects
    assert isinstance(effect, SteerRun)
    return effect.batch


def test_steer_messages_are_debounced_like_a_batch(make: Messages) -> None:
    r, _ = running(make)
    m1, m2 = make(KEY), make(KEY)
    assert r.message(m1, now=10.0, mode=STEER) == [ArmTimer(11.0)]
    assert r.message(m2, now=10.5, mode=STEER) == []  # the window restarts: 11.5
    assert r.pending == r.steering == 2
    assert r.tick(11.0) == [ArmTimer(11.5)]
    assert r.tick(11.5) == [SteerRun(Batch(KEY, (m1, m2)), interrupt=False)]
    assert r.steering == 2  # offered, not taken yet


def test_max_batch_caps_a_steer_batch(make: Messages) -> None:
    r, _ = running(make)
    msgs = [make(KEY) for _ in range(4)]
    assert r.message(msgs[0], now=1.0, mode=STEER) == [ArmTimer(2.0)]
    assert r.message(msgs[1], now=1.0, mode=STEER) == []
    assert offered(r.message(msgs[2], now=1.0, mode=STEER)).messages == tuple(msgs[:3])
    # The fourth gathers into the next one, behind the offer out.
    assert r.message(msgs[3], now=1.0, mode=STEER) == [ArmTimer(2.0)]


def test_the_max_wait_closes_a_busy_steer_window(make: Messages) -> None:
    r = Room(KEY, DispatchLimits(1.0, 2.0, 99, 1))
    r.message(make(KEY), now=0.0)
    r.tick(1.0)
    r.slot_granted(1.0)
    r.begin()
    msgs = [make(KEY) for _ in range(4)]
    effects: list[Effect] = []
    for i, m in enumerate(msgs):
        effects += r.message(m, now=10.0 + 0.5 * i, mode=STEER)
        effects += r.tick(10.0 + 0.5 * i)
    assert effects == [ArmTimer(11.0), ArmTimer(12.0)]
    assert offered(r.tick(12.0)).messages == tuple(msgs)  # first + max wait


def test_the_interrupt_mode_asks_to_interrupt(make: Messages) -> None:
    r, _ = running(make)
    r.message(make(KEY), now=2.0, mode=DuringRun.INTERRUPT)
    [effect] = r.tick(3.0)
    assert effect == SteerRun(effect.batch, interrupt=True)  # type: ignore[union-attr]


def test_a_run_not_begun_is_not_steered(make: Messages) -> None:
    r, _ = running(make, begun=False)
    m = make(KEY)
    assert r.message(m, now=2.0, mode=STEER) == []
    assert r.steering == 0
    assert r.pending == 1
    assert r.begin()
    # Queued before it began: later messages queue behind it (they would overtake it).
    assert r.message(make(KEY), now=3.0, mode=STEER) == []
    assert r.steering == 0


def test_queue_mode_and_a_stopping_run_do_not_steer(make: Messages) -> None:
    r, _ = running(make)
    assert r.message(make(KEY), now=2.0) == []  # queue mode
    assert r.steering == 0
    r2, _ = running(Messages())
    r2.stop()
    assert r2.message(make(KEY), now=2.0, mode=STEER) == []
    assert r2.steering == 0


def test_messages_during_an_offer_form_the_next_steer_batch(make: Messages) -> None:
    r, _ = running(make)
    first = [make(KEY) for _ in range(3)]
    for m in first[:2]:
        r.message(m, now=2.0, mode=STEER)
    out = offered(r.message(first[2], now=2.0, mode=STEER))
    later = [make(KEY) for _ in range(3)]
    r.message(later[0], now=2.5, mode=STEER)
    r.message(later[1], now=2.6, mode=STEER)
    assert r.message(later[2], now=2.7, mode=STEER) == []  # due, but one offer at a time
    answered, effects = r.steer_answered(out, taken=True)
    assert answered
    assert offered(effects).messages == tuple(later)
    assert r.steered == 3


def test_a_refused_steer_batch_queues_ahead_of_what_came_since(make: Messages) -> None:
    r, _ = running(make)
    msgs = [make(KEY) for _ in range(5)]
    for m in msgs[:3]:
        effects = r.message(m, now=2.0, mode=STEER)
    out = offered(effects)
    r.message(msgs[3], now=2.5, mode=STEER)  # next steer batch
    r.message(msgs[4], now=2.6)  # queue mode now: queued, behind the steer batch
    assert r.steer_answered(out, taken=False) == (True, [])
    assert r.steering == 0
    assert r.pending == 5
    # Once refused, what arrives queues too (nothing may overtake the queue).
    r.message(make(KEY), now=3.0, mode=STEER)
    assert r.steering == 0
    assert r.run_finished(4.0) == [ReleaseSlot(), RequestSlot()]
    follow_up = started(r.slot_granted(4.0))
    assert follow_up.messages == tuple(msgs[:3])  # max_batch, in order


def test_a_taken_steer_batch_is_the_runs_a_stop_does_not_give_it_back(make: Messages) -> None:
    r, run = running(make)
    msgs = [make(KEY) for _ in range(3)]
    for m in msgs:
        effects = r.message(m, now=2.0, mode=STEER)
    out = offered(effects)
    r.steer_answered(out, taken=True)
    gathering = make(KEY)
    r.message(gathering, now=3.0, mode=STEER)
    assert r.stop() == [CancelRun(run, EndReason.STOPPED), Dropped((gathering,))]
    assert r.steered == 3
    assert r.run_finished(5.0) == [ReleaseSlot()]
    assert r.idle


def test_a_stop_drops_an_offer_out_and_ignores_its_late_answer(make: Messages) -> None:
    r, run = running(make)
    msgs = [make(KEY) for _ in range(4)]
    for m in msgs[:3]:
        effects = r.message(m, now=2.0, mode=STEER)
    out = offered(effects)
    r.message(msgs[3], now=2.0, mode=STEER)
    assert r.stop() == [CancelRun(run, EndReason.STOPPED), Dropped(tuple(msgs))]
    assert r.steer_answered(out, taken=True) == (False, [])
    assert r.steered == 0
    assert r.pending == 0


def test_steer_messages_not_taken_when_the_run_ends_run_next_in_order(make: Messages) -> None:
    r2, _ = running(Messages())
    a, b, c = make(KEY), make(KEY), make(KEY)
    r2.message(a, now=2.0, mode=STEER)
    r2.message(b, now=2.0, mode=STEER)
    out2 = offered(r2.message(c, now=2.0, mode=STEER))
    d = make(KEY)
    r2.message(d, now=2.5, mode=STEER)
    assert r2.run_finished(3.0) == [ReleaseSlot(), RequestSlot()]
    assert r2.steer_answered(out2, taken=True) == (False, [])  # too late: it ended
    batch = started(r2.slot_granted(3.0))
    assert batch.messages == (a, b, c)
    assert r2.pending == 1  # d
    assert r2.tick(100.0) == []  # the steer window died with the run


def test_a_drain_stops_steering_what_gathers_stays_queued(make: Messages) -> None:
    r, run = running(make)
    m = make(KEY)
    r.message(m, now=2.0, mode=STEER)
    assert r.drain() == []
    assert r.steering == 0
    assert r.pending == 1
    assert r.tick(3.0) == []
    assert r.interrupt() == [CancelRun(run, EndReason.INTERRUPTED)]


def test_edits_and_deletions_reach_steer_messages_not_offered(make: Messages) -> None:
    r, _ = running(make)
    m1, m2 = make(KEY), make(KEY)
    r.message(m1, now=2.0, mode=STEER)
    r.message(m2, now=2.0, mode=STEER)
    edited = Message(
        id=m2.id,
        room=KEY,
        sender=m2.sender,
        text="edited",
        external_id=m2.external_id,
        received_at=0.0,
    )
    assert r.replace(edited)
    assert r.remove(m1, 0.0) == (True, [])
    assert offered(r.tick(3.0)).messages == (edited,)
    assert not r.replace(edited)  # with the run now
    assert r.remove(edited, 0.0) == (False, [])


# -- the scheduler -------------------------------------------------------------


def test_the_scheduler_asks_the_mode_and_counts_steer_messages_as_queued(
    make: Messages,
) -> None:
    modes = {KEY: DuringRun.STEER}
    s = Scheduler(LIMITS, mode_of=lambda k: modes.get(k, DuringRun.QUEUE))
    s.submit(make(KEY), now=0.0)
    run = started(s.fire_timers(now=1.0))
    assert s.begin(KEY)
    m = make(KEY)
    assert s.submit(m, now=2.0) == []
    assert s.queued == 1
    status = s.status(KEY)
    assert (status.waiting, status.steering, status.steered) == (1, 1, 0)
    [steer] = s.fire_timers(now=3.0)
    assert steer == SteerRun(Batch(KEY, (m,)), interrupt=False)
    assert isinstance(steer, SteerRun)
    assert s.offered(KEY) is steer.batch
    assert s.steer_answered(KEY, steer.batch, True, now=3.0) == []
    assert s.queued == 0
    status = s.status(KEY)
    assert (status.waiting, status.steering, status.steered) == (0, 0, 1)
    assert s.stop(KEY) == StopResult(stopped=run, dropped=())
    assert s.run_finished(KEY, now=4.0) == []
    assert s.room_count == 0


def test_the_scheduler_steers_no_more_once_draining(make: Messages) -> None:
    s = Scheduler(LIMITS, mode_of=lambda k: DuringRun.STEER)
    s.submit(make(KEY), now=0.0)
    s.fire_timers(now=1.0)
    s.begin(KEY)
    s.drain()
    s.submit(make(KEY), now=2.0)
    assert s.fire_timers(now=10.0) == []
    assert s.status(KEY).steering == 0
    assert s.queued == 1


def test_a_run_granted_but_skipped_is_not_steered(make: Messages) -> None:
    r, batch = running(make, begun=False)
    assert r.stop() == [SkipRun(batch, dropped=True), Dropped(batch.messages)]
    assert r.message(make(KEY), now=2.0, mode=STEER) == []
    assert r.steering == 0


def test_an_edit_of_a_message_waiting_twice_reaches_the_older_copy(make: Messages) -> None:
    """``!retry`` may queue a message again while its first copy gathers to steer."""
    r, _ = running(make)
    m = make(KEY)
    r.message(m, now=2.0, mode=STEER)
    r.message(m, now=2.1)  # queue mode now: queued behind the steer batch
    edited = Message(
        id=m.id,
        room=KEY,
        sender=m.sender,
        text="edited",
        external_id=m.external_id,
        received_at=0.0,
    )
    assert r.replace(edited)
    assert offered(r.tick(3.1)).messages == (edited,)
    assert r.remove(m, 0.0) == (True, [])  # the queued copy
    assert r.pending == 1  # the offer


def test_only_the_runs_thread_steers_it(make: Messages) -> None:
    """A message from another thread queues: the run answers in its own thread."""
    r, _ = running(make)
    other = make(KEY, "elsewhere", thread="t9")
    assert r.message(other, now=2.0, mode=STEER) == []
    assert (r.steering, r.pending) == (0, 1)
    # Queued now, so nothing steers any more until the run ends.
    assert r.message(make(KEY, "same thread"), now=2.1, mode=STEER) == []
    assert (r.steering, r.pending) == (0, 2)
    assert r.run_finished(3.0) == [ReleaseSlot(), RequestSlot()]
    assert started(r.slot_granted(3.0)).messages == (other,)  # its thread alone

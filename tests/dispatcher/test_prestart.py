"""Prestart decisions of the scheduler, rule by rule, with explicit times."""

from __future__ import annotations

import pytest

from bridge.core.model import Batch
from dispatcher.limits import DispatchLimits
from dispatcher.policy import PrestartCancel
from dispatcher.room import BeginPrestart, CancelPrestart, StartRun
from dispatcher.scheduler import Action, Scheduler
from tests.dispatcher.fakes import Messages, room

A, B, C, D = room("a"), room("b"), room("c"), room("d")


def scheduler(cap: int = 2, max_prestarts: int = 2, max_batch: int = 3) -> Scheduler:
    limits = DispatchLimits(
        coalesce_s=1.0, max_wait_s=5.0, max_batch=max_batch, max_concurrent_runs=cap
    )
    return Scheduler(limits, max_prestarts=max_prestarts)


def run_of(actions: list[Action]) -> StartRun:
    [start] = [a for a in actions if isinstance(a, StartRun)]
    return start


@pytest.fixture
def make() -> Messages:
    return Messages()


def test_a_batch_opening_in_an_idle_room_begins_a_prestart_its_run_takes(
    make: Messages,
) -> None:
    s = scheduler()
    assert s.submit(make(A), now=0.0) == [BeginPrestart(A)]
    assert s.submit(make(A), now=0.5) == []  # one per room
    assert s.prestarts == 1
    start = run_of(s.fire_timers(now=1.5))
    assert start.prestarted
    assert s.prestarts == 0  # carried by the run: budgeted as a run
    assert s.holds_prestart(A)
    assert s.begin(A)
    assert not s.holds_prestart(A)  # consumed: execute takes it
    # Messages queued behind a run do not open a batch: no prestart.
    assert s.submit(make(A), now=2.0) == []
    assert not run_of(s.run_finished(A, now=3.0)).prestarted


def test_prestarts_are_bounded_by_max_prestarts_and_the_spare_slots(make: Messages) -> None:
    s = scheduler(cap=3, max_prestarts=2)
    assert s.submit(make(A), now=0.0) == [BeginPrestart(A)]
    assert s.submit(make(B), now=0.0) == [BeginPrestart(B)]
    assert s.submit(make(C), now=0.0) == []  # max_prestarts
    s2 = scheduler(cap=2, max_prestarts=2)
    s2.submit(make(A), now=0.0)
    s2.fire_timers(now=1.0)  # A runs (its prestart with it)
    assert s2.submit(make(B), now=1.0) == [BeginPrestart(B)]  # 1 run + 0 < 2
    assert s2.submit(make(C), now=1.0) == []  # 1 run + 1 prestart: no spare slot


def test_no_prestart_while_a_room_waits_or_for_a_batch_that_goes_at_once(
    make: Messages,
) -> None:
    s = scheduler(cap=1, max_prestarts=1, max_batch=1)
    start = run_of(s.submit(make(A), now=0.0))  # full at once: granted, cold
    assert not start.prestarted
    assert s.submit(make(B), now=0.0) == []  # ready at once, and waits
    assert s.waiting_for_slot == 1
    s3 = scheduler(cap=2, max_prestarts=2, max_batch=1)
    s3.submit(make(A), now=0.0)
    s3.submit(make(B), now=0.0)
    s3.submit(make(C), now=0.0)  # C waits for a slot
    s3.run_finished(A, now=0.0)  # C runs; nobody waits now
    s3.submit(make(D), now=0.0)
    assert s3.prestarts == 0  # max_batch 1: never gathering


def test_a_stop_cancels_the_prestart_of_a_dropped_batch(make: Messages) -> None:
    s = scheduler()
    s.submit(make(A), now=0.0)
    s.stop(A)
    assert s.take_actions() == [CancelPrestart(A, PrestartCancel.DROPPED)]
    # Also once granted, if the run never began.
    s.submit(make(A), now=1.0)
    assert run_of(s.fire_timers(now=2.0)).prestarted
    s.stop(A)
    assert s.take_actions() == [CancelPrestart(A, PrestartCancel.DROPPED)]
    assert not s.begin(A)
    assert s.run_finished(A, now=3.0) == []
    assert s.take_actions() == []


def test_a_room_left_with_nothing_cancels_its_prestart_as_idle(make: Messages) -> None:
    s = scheduler()
    m = make(A)
    s.submit(m, now=0.0)
    assert s.remove(m, now=0.5)
    assert s.take_actions() == [CancelPrestart(A, PrestartCancel.IDLE)]
    assert s.room_count == 0


def test_a_drain_cancels_every_prestart_and_begins_none(make: Messages) -> None:
    s = scheduler(cap=3)
    s.submit(make(A), now=0.0)
    s.fire_timers(now=1.0)  # A granted with its prestart, not begun
    s.submit(make(B), now=1.0)
    s.drain()
    assert s.take_actions() == [
        CancelPrestart(B, PrestartCancel.SHUTDOWN),
        CancelPrestart(A, PrestartCancel.SHUTDOWN),
    ]
    assert not s.begin(A)
    assert s.submit(make(C), now=2.0) == []


def test_a_room_waiting_for_a_slot_keeps_its_own_prestart(make: Messages) -> None:
    s = scheduler(cap=2, max_prestarts=2)
    s.submit(make(A), now=0.0)
    s.fire_timers(now=1.0)  # A runs
    assert s.submit(make(B), now=1.0) == [BeginPrestart(B)]
    assert s.submit(make(C), now=1.2) == []  # 1 run + 1 prestart: none spare
    s.submit(make(B), now=1.9)  # B's window now closes at 2.9
    assert not run_of(s.fire_timers(now=2.2)).prestarted  # C runs, cold: cap reached
    assert s.fire_timers(now=2.9) == []  # B waits, keeping its prestart
    assert s.holds_prestart(B)
    assert run_of(s.run_finished(A, now=3.0)).prestarted


def test_a_room_waiting_for_a_slot_makes_other_prestarts_give_way(make: Messages) -> None:
    s = scheduler(cap=2, max_prestarts=1)
    s.submit(make(A), now=0.0)
    s.fire_timers(now=1.0)  # A runs
    assert s.submit(make(C), now=1.0) == [BeginPrestart(C)]
    s.submit(make(D), now=1.0)  # max_prestarts reached
    s.submit(make(B), now=1.5)
    s.submit(make(C), now=1.8)  # C keeps gathering until 2.8
    assert run_of(s.fire_timers(now=2.0)).batch.room == D  # cap reached
    # B is ready and waits: C's prestart would hold budget B needs.
    assert s.fire_timers(now=2.5) == [CancelPrestart(C, PrestartCancel.SLOT_NEEDED)]
    assert s.prestarts == 0
    assert s.submit(make(room("e")), now=2.6) == []  # none begins while B waits


def test_an_adopted_run_cancels_the_rooms_prestart(make: Messages) -> None:
    s = scheduler()
    s.submit(make(A), now=0.0)
    s.adopt(Batch(A, (make(A),)), now=0.5)
    assert s.take_actions() == [CancelPrestart(A, PrestartCancel.ADOPTED)]


def test_no_prestarts_before_serving_or_without_budget(make: Messages) -> None:
    limits = DispatchLimits(1.0, 5.0, 3, 2)
    assert Scheduler(limits, capacity=0, max_prestarts=2).submit(make(A), now=0.0) == []
    assert Scheduler(limits).submit(make(A), now=0.0) == []  # max_prestarts 0
    with pytest.raises(ValueError, match="max_prestarts"):
        Scheduler(limits, max_prestarts=-1)


def test_a_thread_waiting_for_its_rooms_cap_does_not_stop_prestarts_elsewhere(
    make: Messages,
) -> None:
    """``max_runs_per_room``: a thread waits because its room is at its cap, not
    for want of a slot. Free slots stay spare, so other rooms' batches still
    prestart, and the prestarts they have are not given up for it."""
    limits = DispatchLimits(coalesce_s=1.0, max_wait_s=5.0, max_batch=3, max_concurrent_runs=5)
    s = Scheduler(limits, max_prestarts=3, room_cap=lambda key: 1 if key == A else None)
    a1, a2 = A.in_thread("1"), A.in_thread("2")
    s.submit(make(a1), now=0.0)
    assert run_of(s.fire_timers(now=1.5)).batch.room == a1
    assert s.submit(make(a2), now=2.0) == [BeginPrestart(a2)]
    assert s.submit(make(B), now=2.5) == [BeginPrestart(B)]
    assert s.fire_timers(now=3.1) == []  # a2 closes its batch and waits behind a1
    assert s.waiting_for_slot == 1
    assert s.prestarts == 2  # B keeps its prestart: three slots are free
    assert s.submit(make(C), now=3.2) == [BeginPrestart(C)]
    # B's run takes its prestart; a2 keeps its own for when a1 ends.
    assert run_of(s.fire_timers(now=3.6)).prestarted
    assert run_of(s.run_finished(a1, now=4.0)).prestarted

"""The scheduler's rules for adopted runs and detaching shutdowns, with explicit times."""

from __future__ import annotations

import pytest

from bridge.core.model import Batch
from dispatcher.limits import DispatchLimits
from dispatcher.room import StartRun
from dispatcher.scheduler import Action, Scheduler
from dispatcher.status import EndReason, StopResult
from tests.dispatcher.fakes import Messages, room

A, B, C = room("a"), room("b"), room("c")


def limits(cap: int = 1, max_batch: int = 3) -> DispatchLimits:
    return DispatchLimits(
        coalesce_s=1.0, max_wait_s=5.0, max_batch=max_batch, max_concurrent_runs=cap
    )


def starts(actions: list[Action]) -> list[Batch]:
    """The batches of the runs started, in order."""
    return [a.batch for a in actions if isinstance(a, StartRun)]


@pytest.fixture
def make() -> Messages:
    return Messages()


def test_an_adopted_run_counts_beyond_the_cap_and_others_wait_below_it(make: Messages) -> None:
    s = Scheduler(limits(cap=1))
    s.submit(make(A), now=0.0)
    [run_a] = starts(s.fire_timers(now=1.0))
    adopted = Batch(B, (make(B),))
    s.adopt(adopted, now=1.0)
    assert s.active_runs == 2  # over the cap: it was going already
    assert s.status(B).running == adopted
    s.submit(make(C), now=1.0)
    assert s.fire_timers(now=2.0) == []
    assert s.status(C).waiting_for_slot
    assert s.run_finished(A, now=3.0) == []  # one run left: still at the cap
    [run_c] = starts(s.run_finished(B, now=4.0))
    assert run_c.room == C
    assert run_a.room == A


def test_adopting_before_serving_holds_a_slot_of_the_cap(make: Messages) -> None:
    """The driver's scheduler has no slots until it serves; the adoption counts then."""
    s = Scheduler(limits(cap=2), capacity=0)
    s.adopt(Batch(A, (make(A),)), now=0.0)
    s.submit(make(B), now=0.0)
    s.submit(make(C), now=0.0)
    s.fire_timers(now=1.0)
    [started] = starts(s.set_capacity(2, now=1.0))
    assert started.room == B
    assert s.status(C).waiting_for_slot
    assert s.active_runs == 2


def test_messages_queue_behind_an_adopted_run_and_follow_it(make: Messages) -> None:
    s = Scheduler(limits(cap=1, max_batch=2))
    gathering = make(A)
    s.submit(gathering, now=0.0)  # its window would close at 1.0
    s.adopt(Batch(A, (make(A),)), now=0.5)
    after = [make(A), make(A)]
    for m in after:
        s.submit(m, now=3.0)
    assert s.fire_timers(now=10.0) == []  # no window runs out behind a run
    assert s.queued == 3
    [follow_up] = starts(s.run_finished(A, now=11.0))
    assert follow_up.messages == (gathering, after[0])  # at once, up to max_batch
    [rest] = starts(s.run_finished(A, now=12.0))
    assert rest.messages == (after[1],)
    assert s.queued == 0


def test_an_adopted_run_is_stopped_and_interrupted_like_any_run(make: Messages) -> None:
    s = Scheduler(limits())
    adopted = Batch(A, (make(A),))
    s.adopt(adopted, now=0.0)
    assert s.begin(A)  # the driver's task carries it on
    queued = make(A)
    s.submit(queued, now=1.0)
    assert s.stop(A) == StopResult(stopped=adopted, dropped=(queued,))
    assert s.cancel_reason(A) is EndReason.STOPPED
    s.run_finished(A, now=2.0)
    assert s.room_count == 0

    s.adopt(adopted, now=3.0)
    s.drain()
    assert s.interrupt(EndReason.DETACHED) == [adopted]
    assert s.cancel_reason(A) is EndReason.DETACHED


def test_a_detaching_shutdown_cancels_only_begun_runs_not_yet_ending(make: Messages) -> None:
    s = Scheduler(limits(cap=3, max_batch=1))
    [run_a] = starts(s.submit(make(A), now=0.0))  # max_batch: granted at once
    s.submit(make(B), now=0.0)
    s.submit(make(C), now=0.0)
    assert s.begin(A)
    assert s.begin(B)
    s.stop(B)
    s.drain()
    assert s.interrupt(EndReason.DETACHED) == [run_a]
    assert s.cancel_reason(B) is EndReason.STOPPED
    assert not s.begin(C)  # drained before it began: back in the queue
    s.stop(A)  # the room's word wins over the detach
    assert s.cancel_reason(A) is EndReason.STOPPED


def test_adoption_is_refused_for_a_room_with_a_run_and_while_draining(make: Messages) -> None:
    s = Scheduler(limits(max_batch=1))
    s.submit(make(A), now=0.0)  # granted, not begun
    with pytest.raises(ValueError, match="already has a run"):
        s.adopt(Batch(A, (make(A),)), now=0.0)
    assert s.active_runs == 1
    s.drain()
    with pytest.raises(RuntimeError, match="draining"):
        s.adopt(Batch(B, (make(B),)), now=0.0)
    assert s.room_count == 1

"""A run's slot lent and reclaimed through the driver (dispatcher/lending.py): what the
layer asking people sees, and runs that end while lent or reclaiming."""

from __future__ import annotations

import asyncio

from dispatcher import Dispatcher, DispatchLimits, EndReason, ManualClock, PrestartCancel
from dispatcher.room import BeginPrestart, CancelPrestart, StartRun
from dispatcher.scheduler import Scheduler
from tests.dispatcher.fakes import GUARD_S, Call, FakeExecute, Messages, room, serving

LIMITS = DispatchLimits(coalesce_s=1.0, max_wait_s=5.0, max_batch=1, max_concurrent_runs=1)
A, B, C, E, G = (room(n) for n in "abceg")


async def lent_to_b(dispatcher: Dispatcher, execute: FakeExecute, messages: Messages) -> Call:
    """A's run lends the one slot and B's run takes it; A's call."""
    dispatcher.submit(messages(A))
    a = await execute.started(A)
    a.run.slot.lend()
    assert dispatcher.lent_runs == 1
    dispatcher.submit(messages(B))  # full batch: due at once, and a slot is free
    await execute.started(B)
    return a


async def test_a_lent_slot_runs_another_room_and_the_reclaimer_goes_on_when_it_ends() -> None:
    messages, execute = Messages(), FakeExecute()
    dispatcher = Dispatcher(LIMITS, execute, ManualClock())
    async with serving(dispatcher):
        a = await lent_to_b(dispatcher, execute, messages)
        dispatcher.submit(messages(C))
        reclaim = a.run.slot.reclaim()
        assert reclaim.ahead == 0
        assert not reclaim.resumed.done()
        await execute.finish(B)
        # A goes first: C, which waited longer, waits behind a run already going.
        assert reclaim.resumed.result() is True
        assert C not in execute.active
        assert dispatcher.lent_runs == 0
        await execute.finish(A)
        await execute.finish(C)


async def test_a_run_stopped_while_reclaiming_hears_false_and_leaks_no_slot() -> None:
    messages, execute = Messages(), FakeExecute()
    dispatcher = Dispatcher(LIMITS, execute, ManualClock())
    async with serving(dispatcher):
        a = await lent_to_b(dispatcher, execute, messages)
        reclaim = a.run.slot.reclaim()
        assert not reclaim.resumed.done()
        dispatcher.stop(A)
        await execute.cancelled(a)
        await execute.ended(a)
        assert reclaim.resumed.result() is False
        assert a.run.end_reason is EndReason.STOPPED
        # Ended: lending or reclaiming again changes nothing.
        a.run.slot.lend()
        assert (await asyncio.wait_for(a.run.slot.reclaim().resumed, GUARD_S)) is False
        assert dispatcher.active_runs == 1
        assert dispatcher.lent_runs == 0
        await execute.finish(B)
        dispatcher.submit(messages(C))  # the one slot is free: nothing was lost
        await execute.finish(C)


def test_a_reclaim_that_waits_makes_the_prestarts_of_rooms_not_waiting_give_way() -> None:
    messages = Messages()
    limits = DispatchLimits(coalesce_s=1.0, max_wait_s=5.0, max_batch=3, max_concurrent_runs=2)
    scheduler = Scheduler(limits, max_prestarts=1)
    scheduler.set_capacity(2, 0.0)
    scheduler.submit(messages(A), 0.0)
    assert [type(x) for x in scheduler.fire_timers(1.0)] == [StartRun]
    assert scheduler.begin(A)
    scheduler.lend(A, 1.0)  # A waits for a person
    scheduler.submit(messages(B), 1.0)  # gathers, with the one prestart
    scheduler.submit(messages(G), 1.1)  # gathers, without
    assert [type(x) for x in scheduler.fire_timers(2.0)] == [StartRun]  # B
    assert scheduler.submit(messages(E), 2.0) == [BeginPrestart(E)]
    assert [type(x) for x in scheduler.fire_timers(2.1)] == [StartRun]  # G: every slot taken
    ahead, actions = scheduler.reclaim(A, 2.1)
    assert ahead == 0
    # A waits for a slot: E's prestart would take a claude its run cannot have soon.
    assert actions == [CancelPrestart(E, PrestartCancel.SLOT_NEEDED)]

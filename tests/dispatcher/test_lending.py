"""A run's slot lent and reclaimed through the driver (dispatcher/lending.py): what the
layer asking people sees, and runs that end while lent or reclaiming."""

from __future__ import annotations

import asyncio

from dispatcher import Dispatcher, DispatchLimits, EndReason, ManualClock
from tests.dispatcher.fakes import GUARD_S, FakeExecute, Messages, room, serving

LIMITS = DispatchLimits(coalesce_s=1.0, max_wait_s=5.0, max_batch=1, max_concurrent_runs=1)
A, B, C = room("a"), room("b"), room("c")


async def test_a_lent_slot_runs_another_room_and_the_reclaimer_goes_on_when_it_ends() -> None:
    messages, execute = Messages(), FakeExecute()
    dispatcher = Dispatcher(LIMITS, execute, ManualClock())
    async with serving(dispatcher):
        dispatcher.submit(messages(A))
        a = await execute.started(A)
        a.run.slot.lend()
        assert dispatcher.lent_runs == 1
        dispatcher.submit(messages(B))  # full batch: due at once, and a slot is free
        await execute.started(B)
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
        dispatcher.submit(messages(A))
        a = await execute.started(A)
        a.run.slot.lend()
        dispatcher.submit(messages(B))
        await execute.started(B)
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

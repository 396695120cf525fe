"""A window that follows typing (docs/live-runs.md): examples on the room, then the
driver with a manual clock."""

from __future__ import annotations

from bridge.core.model import Batch, UserId
from dispatcher import Dispatcher, DispatchLimits, DuringRun, ManualClock
from dispatcher.room import REQUEST_SLOT, ArmTimer, Phase, Room, StartRun, SteerRun
from tests.dispatcher.fakes import FakeExecute, Messages, room, serving

LIMITS = DispatchLimits(coalesce_s=1.5, max_wait_s=15.0, max_batch=5, max_concurrent_runs=2)
KEY = room("a")
IDLE = 0.3
ALICE, BOB = UserId("alice"), UserId("bob")


def phase(r: Room) -> Phase:
    return r.phase


def test_a_single_message_waits_only_the_idle_time() -> None:
    make = Messages()
    r = Room(KEY, LIMITS, idle_s=IDLE)
    assert r.message(make(KEY), now=10.0) == [ArmTimer(10.3)]
    assert r.tick(10.3) == [REQUEST_SLOT]


def test_the_window_stays_open_while_its_sender_types_and_closes_idle_after() -> None:
    make = Messages()
    r = Room(KEY, LIMITS, idle_s=IDLE)
    r.message(make(KEY), now=10.0)
    assert r.typing(frozenset({ALICE}), now=10.1) == []  # the deadline moves later
    assert r.tick(10.3) == [ArmTimer(25.0)]  # early tick: re-armed for max wait
    r.message(make(KEY), now=12.0)  # the second piece
    assert r.typing(frozenset(), now=13.0) == [ArmTimer(13.3)]  # stopped: closes earlier
    assert phase(r) is Phase.GATHERING
    assert r.tick(13.3) == [REQUEST_SLOT]
    assert r.pending == 2


def test_typing_of_someone_without_a_waiting_message_does_not_hold_the_window() -> None:
    make = Messages()
    r = Room(KEY, LIMITS, idle_s=IDLE)
    r.message(make(KEY, sender="alice"), now=10.0)
    assert r.typing(frozenset({BOB}), now=10.1) == []
    assert r.tick(10.3) == [REQUEST_SLOT]


def test_typing_never_holds_the_window_past_max_wait() -> None:
    make = Messages()
    r = Room(KEY, LIMITS, idle_s=IDLE, typing=frozenset({ALICE}))
    assert r.message(make(KEY), now=0.0) == [ArmTimer(15.0)]
    assert r.tick(15.0) == [REQUEST_SLOT]


def test_deleting_the_typing_senders_message_lets_the_rest_close_idle_after() -> None:
    make = Messages()
    r = Room(KEY, LIMITS, idle_s=IDLE, typing=frozenset({ALICE}))
    held = make(KEY, sender="alice")
    assert r.message(held, now=10.0) == [ArmTimer(25.0)]  # alice types: up to max wait
    r.message(make(KEY, sender="bob"), now=10.1)
    # bob's message no longer waits for alice: quiet from the deletion on.
    assert r.remove(held, now=12.0) == (True, [ArmTimer(12.3)])
    assert r.tick(12.3) == [REQUEST_SLOT]


def test_typing_that_stops_after_the_idle_time_is_due_at_once() -> None:
    make = Messages()
    r = Room(KEY, LIMITS, idle_s=0.0, typing=frozenset({ALICE}))
    r.message(make(KEY), now=1.0)
    assert r.typing(frozenset(), now=2.0) == [REQUEST_SLOT]


def test_a_plain_room_ignores_typing() -> None:
    make = Messages()
    r = Room(KEY, LIMITS)
    assert r.message(make(KEY), now=10.0) == [ArmTimer(11.5)]
    assert r.typing(frozenset({ALICE}), now=10.1) == []
    assert r.tick(11.5) == [REQUEST_SLOT]


async def test_a_burst_typed_in_pieces_makes_one_run_on_the_driver() -> None:
    clock = ManualClock()
    execute = FakeExecute(cap=2)
    idle_of = {KEY: IDLE}
    d = Dispatcher(LIMITS, execute, clock, idle_of=idle_of.get)
    make = Messages()
    other = room("plain")
    async with serving(d):
        first, plain = make(KEY), make(other)
        d.submit(first)
        d.submit(plain)
        d.typing(KEY, frozenset({ALICE}))
        d.typing(other, frozenset({ALICE}))  # a plain room keeps its window
        clock.advance(1.0)
        second = make(KEY)
        d.submit(second)
        clock.advance(2.0)
        assert d.status(KEY).running is None
        assert d.status(other).running is not None  # closed at 1.5
        d.typing(KEY, frozenset())
        clock.advance(IDLE)
        call = await execute.started(KEY)
        assert call.batch.messages == (first, second)
        assert call.run.batch is call.batch
        assert d.status(KEY).running_since == 3.0 + IDLE


def test_a_steer_batch_window_follows_typing_too() -> None:
    make = Messages()
    r = Room(KEY, LIMITS, idle_s=IDLE)
    r.message(make(KEY), now=0.0)
    r.tick(IDLE)
    [start] = r.slot_granted(IDLE)
    assert isinstance(start, StartRun)
    assert r.begin()
    steer = make(KEY)
    assert r.message(steer, now=5.0, mode=DuringRun.STEER) == [ArmTimer(5.3)]
    assert r.typing(frozenset({ALICE}), now=5.1) == []
    assert r.tick(5.3) == [ArmTimer(20.0)]  # held while its sender types
    assert r.typing(frozenset(), now=7.0) == [ArmTimer(7.3)]
    assert r.tick(7.3) == [SteerRun(Batch(KEY, (steer,)), interrupt=False)]


async def test_a_deletion_on_the_driver_lets_the_rest_run_idle_after_it() -> None:
    clock = ManualClock()
    execute = FakeExecute(cap=2)
    d = Dispatcher(LIMITS, execute, clock, idle_of={KEY: IDLE}.get)
    make = Messages()
    async with serving(d):
        d.typing(KEY, frozenset({ALICE}))
        held, rest = make(KEY, sender="alice"), make(KEY, sender="bob")
        d.submit(held)
        d.submit(rest)
        clock.advance(2.0)
        assert d.remove(held)  # alice's message goes: nothing holds bob's open
        clock.advance(IDLE)
        call = await execute.started(KEY)
        assert call.batch.messages == (rest,)
        assert d.status(KEY).running_since == 2.0 + IDLE

"""Property tests: runs that lend their slot while they wait for a person, and reclaim it.

A hypothesis state machine submits messages to several rooms, moves time (so
batches become due and runs start), begins the granted runs, has begun runs
lend their slot and reclaim it, go on without an answer (claude withdrew its
request: the run holds a slot at once, beyond the cap if need be), finishes
and stops runs (a stop, a timeout's answer or a takeover all end in
:meth:`Scheduler.run_finished`), and drains.
After every step it checks:

- no grant (a new run, a reclaimer resumed) while the runs holding a slot (begun
  or granted, not lent) are at the cap, and never two runs in one room;
- no slot lost or doubled: the pool's holders and lenders are exactly the
  model's, and a free slot means nobody reclaims;
- reclaimers are given slots first-come and ahead of new runs: within a step,
  every :class:`Reclaimed` comes before any new :class:`StartRun`, none starts
  while a reclaimer waits, and reclaimers resume in the order they asked;
- once draining, a reclaim is answered at once and nothing starts;
- prestarts: none begins while a run waits for its slot back, and those of
  rooms not waiting for a slot themselves give way to it.

At the end it finishes the runs one by one, those not reclaiming first, and checks
that reclaimers resume as slots free: no reclaimer waits forever once slots free.

Every path is taken, or a check on it would pass whatever the scheduler did:
the machine starts with runs begun (often more rooms than slots, so a lent slot is
taken at once, some lent and reclaimed), and drains and finishes runs more often
while a run waits for its slot back; :func:`test_every_path_is_reached` checks
that the generator (derandomized) takes each path of :data:`PATHS` but
:data:`TOO_RARE`; :data:`RARE` spells the rarest out as sequences of the
machine's own steps.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from bridge.core.model import RoomKey
from dispatcher.limits import DispatchLimits
from dispatcher.room import BeginPrestart, CancelPrestart, StartRun
from dispatcher.scheduler import Action, Scheduler
from dispatcher.status import Reclaimed
from tests.dispatcher.fakes import Messages, room

ROOMS = [room(n) for n in range(5)]
HELD, LENT, RECLAIMING = "held", "lent", "reclaiming"

PATHS = frozenset(
    {
        "reclaimed at once",
        "reclaim queued",
        "reclaim asked again",
        "reclaimed at once while draining",
        "resumed on finish",
        "resumed on lend",
        "resumed on resize",
        "resumed on drain",
        "went on while lent",
        "went on while reclaiming",
        "a reclaimer finished",
        "a reclaimer stopped",
        "drained while a run waits for its slot back",
        "drained with a run granted, not begun",
        "a prestart gave way to a reclaimer",
    }
)
"""The paths :func:`test_every_path_is_reached` requires the generator to reach."""
TOO_RARE = frozenset(
    {
        "a prestart gave way to a reclaimer",
        "a reclaimer finished",
        "reclaim asked again",
        "resumed on lend",
    }
)
"""Paths the generator takes in under 1 example in 40, too seldom to require of it:
:data:`RARE` takes them (and others) as set sequences."""


class Lending(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.messages = Messages()
        self.now = 0.0
        self.cap = 1
        self.scheduler = Scheduler(DispatchLimits(1.0, 3.0, 3, 1))
        self.runs: dict[RoomKey, str] = {}
        """Rooms with a run (granted or begun) and how it stands with its slot."""
        self.begun: set[RoomKey] = set()
        self.queue: list[RoomKey] = []
        """Reclaimers in the order they asked."""
        self.draining = False
        self.prestarts: set[RoomKey] = set()

    @initialize(
        cap=st.integers(1, 3),
        prestarts=st.integers(0, 3),
        extra=st.integers(-1, 2),
        lent=st.integers(0, 3),
        reclaiming=st.integers(0, 3),
    )
    def start(self, cap: int, prestarts: int, extra: int, lent: int, reclaiming: int) -> None:
        self.cap = cap
        limits = DispatchLimits(1.0, 3.0, 3, cap)
        self.scheduler = Scheduler(limits, max_prestarts=min(prestarts, cap))
        self.apply(self.scheduler.set_capacity(cap, self.now))
        # Rooms with work at once, ``extra`` more than the slots: the runs granted begin,
        # the others wait; then some runs lend their slot (taken by a waiting room) and
        # some of those want it back (and wait for it, every slot taken).
        for key in ROOMS[: cap + extra]:
            self.submit_to(key)
        self.tick(4.0)
        begun = sorted(self.runs)
        for key in begun:
            self.begin_run(key)
        for key in begun[:lent]:
            self.lend_run(key)
        for key in begun[: min(lent, reclaiming)]:
            self.reclaim_run(key)

    def path(self, name: str) -> None:
        """One of :data:`PATHS` was taken (counted in ``--hypothesis-show-statistics``)."""
        assert name in PATHS, name
        event(name)

    def held(self) -> int:
        return sum(1 for s in self.runs.values() if s == HELD)

    def apply(self, actions: list[Action], via: str = "") -> None:
        waited = list(self.queue)
        started = False
        for action in actions:
            if isinstance(action, StartRun | Reclaimed):
                # (Once draining, reclaimers hold again at once: the going runs finish.)
                assert self.draining or self.held() < self.cap, "a slot granted beyond the cap"
            match action:
                case StartRun(batch):
                    self.prestarts.discard(batch.room)  # taken by its run
                    assert not self.draining, "a run started while draining"
                    assert batch.room not in self.runs, "two runs in one room"
                    assert not self.queue, "a new run started while a run waits for its slot"
                    self.runs[batch.room] = HELD
                    started = True
                case Reclaimed(key):
                    assert not started, "a reclaimer resumed after a new run in the same step"
                    assert self.queue, key
                    assert self.queue[0] == key, (key, self.queue)
                    self.queue.pop(0)
                    self.runs[key] = HELD
                    if via:
                        self.path(f"resumed on {via}")
                case BeginPrestart(key):
                    assert not self.queue, "a prestart began while a run waits for its slot"
                    self.prestarts.add(key)
                case CancelPrestart(key):
                    self.prestarts.discard(key)
                case _:
                    pass
        assert self.queue == waited[len(waited) - len(self.queue) :]

    @rule(n=st.integers(0, len(ROOMS) - 1))
    def submit(self, n: int) -> None:
        self.submit_to(ROOMS[n])

    def submit_to(self, key: RoomKey) -> None:
        self.apply(self.scheduler.submit(self.messages(key), self.now))

    @rule(dt=st.sampled_from([0.5, 1.5, 4.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.apply(self.scheduler.fire_timers(self.now))

    @precondition(lambda self: any(k not in self.begun for k in self.runs))
    @rule(data=st.data())
    def begin(self, data: st.DataObject) -> None:
        self.begin_run(
            data.draw(st.sampled_from(sorted(k for k in self.runs if k not in self.begun)))
        )

    def begin_run(self, key: RoomKey) -> None:
        assert self.scheduler.begin(key)
        self.begun.add(key)

    @precondition(lambda self: any(s == HELD for k, s in self.runs.items() if k in self.begun))
    @rule(data=st.data())
    def lend(self, data: st.DataObject) -> None:
        held = sorted(k for k, s in self.runs.items() if s == HELD and k in self.begun)
        self.lend_run(data.draw(st.sampled_from(held)))

    def lend_run(self, key: RoomKey) -> None:
        self.runs[key] = LENT
        self.apply(self.scheduler.lend(key, self.now), via="lend")

    @precondition(lambda self: any(s != HELD for s in self.runs.values()))
    @rule(data=st.data())
    def reclaim(self, data: st.DataObject) -> None:
        self.reclaim_run(
            data.draw(st.sampled_from(sorted(k for k, s in self.runs.items() if s != HELD)))
        )

    def reclaim_run(self, key: RoomKey) -> None:
        again = self.runs[key] == RECLAIMING
        ahead, actions = self.scheduler.reclaim(key, self.now)
        self.apply(actions)
        if again:
            self.path("reclaim asked again")
            assert ahead == self.queue.index(key)
        elif ahead is None:
            self.path("reclaimed at once while draining" if self.draining else "reclaimed at once")
            assert not self.queue or self.draining, "reclaimed at once past waiting reclaimers"
            self.runs[key] = HELD
        else:
            self.path("reclaim queued")
            if any(isinstance(a, CancelPrestart) for a in actions):
                self.path("a prestart gave way to a reclaimer")
            assert ahead == len(self.queue)
            self.queue.append(key)
            self.runs[key] = RECLAIMING

    @precondition(lambda self: any(s != HELD for s in self.runs.values()))
    @rule(data=st.data())
    def went_on(self, data: st.DataObject) -> None:
        self.go_on(data.draw(st.sampled_from(sorted(k for k, s in self.runs.items() if s != HELD))))

    def go_on(self, key: RoomKey) -> None:
        reclaiming = self.runs[key] == RECLAIMING
        self.path("went on while reclaiming" if reclaiming else "went on while lent")
        actions = self.scheduler.went_on(key)
        assert actions == ([Reclaimed(key)] if reclaiming else []), actions
        if reclaiming:
            self.queue.remove(key)
        self.runs[key] = HELD

    @precondition(lambda self: bool(self.begun))
    @rule(data=st.data(), stop=st.booleans())
    def finish(self, data: st.DataObject, stop: bool) -> None:
        self.finish_run(data.draw(st.sampled_from(sorted(self.begun))), stop)

    def finish_run(self, key: RoomKey, stop: bool) -> None:
        if self.runs[key] == RECLAIMING:
            self.path("a reclaimer stopped" if stop else "a reclaimer finished")
        if stop:
            self.scheduler.stop(key)  # the run winds down, then ends
            self.apply(self.scheduler.take_actions())
        self.end(key, via="finish")

    @precondition(lambda self: bool(self.queue))
    @rule(data=st.data(), stop=st.booleans())
    def finish_while_reclaiming(self, data: st.DataObject, stop: bool) -> None:
        """A second way to :meth:`finish`, open only while a run waits for its slot back
        (a slot frees, or the waiting run ends): the draws take these paths more often."""
        self.finish(data, stop)

    def end(self, key: RoomKey, via: str = "") -> None:
        del self.runs[key]
        self.begun.discard(key)
        if key in self.queue:
            self.queue.remove(key)
        self.apply(self.scheduler.run_finished(key, self.now), via)

    @precondition(lambda self: not self.draining)
    @rule(cap=st.integers(1, 3))
    def resize(self, cap: int) -> None:
        self.cap = cap
        self.apply(self.scheduler.set_capacity(cap, self.now), via="resize")

    @precondition(lambda self: not self.draining)
    @rule()
    def drain(self) -> None:
        if self.queue:
            self.path("drained while a run waits for its slot back")
        if any(k not in self.begun for k in self.runs):
            self.path("drained with a run granted, not begun")
        self.scheduler.drain()
        self.draining = True
        self.apply(self.scheduler.take_actions(), via="drain")
        for key in sorted(k for k in self.runs if k not in self.begun):
            # Granted, not begun: it never begins (its batch queues again) and ends.
            assert not self.scheduler.begin(key)
            self.end(key)
        assert not self.queue, "a reclaimer still waits once draining"

    @precondition(lambda self: bool(self.queue) and not self.draining)
    @rule()
    def drain_while_reclaiming(self) -> None:
        """A second way to :meth:`drain`, open only while a run waits for its slot back:
        the draws drain there twice as often."""
        self.drain()

    @invariant()
    def slots_add_up(self) -> None:
        held = self.held()
        lent = len(self.runs) - held
        assert self.scheduler._slots.in_use == held
        assert self.scheduler.lent_runs == lent
        assert self.scheduler.active_runs == len(self.runs)
        assert self.scheduler._slots.reclaiming == self.queue
        if self.queue:
            assert held >= self.cap, "a reclaimer waits beside a free slot"
            # As for a room waiting: the others' prestarts gave way.
            waiting = {k for k in self.prestarts if self.scheduler._slots.is_waiting(k)}
            assert self.prestarts == waiting

    def teardown(self) -> None:
        # Runs end one by one, those not waiting for their slot back first; the
        # reclaimers resume as slots free (more of them than slots: one by one).
        while self.runs:
            going = sorted(k for k, s in self.runs.items() if s != RECLAIMING)
            assert going, f"reclaimers left waiting, every slot free: {self.queue}"
            key = going[0]
            if key not in self.begun:
                self.begin_run(key)
            self.end(key)


SETTINGS = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
Lending.TestCase.settings = SETTINGS
TestLending = Lending.TestCase


def _waiting_for_its_slot(machine: Lending) -> None:
    """One slot: room 0's run lent it to room 1's and waits for one back."""
    machine.start(cap=1, prestarts=0, extra=1, lent=0, reclaiming=0)
    machine.lend_run(ROOMS[0])  # room 1's run is granted
    machine.reclaim_run(ROOMS[0])


def _then(*steps: Callable[[Lending], None]) -> Callable[[Lending], None]:
    def sequence(machine: Lending) -> None:
        _waiting_for_its_slot(machine)
        for step in steps:
            step(machine)
            machine.slots_add_up()

    return sequence


def _prestart_gives_way(machine: Lending) -> None:
    """Room 2's prestart began in a free slot; room 0 takes it back at once, room 1
    then waits for one: the prestart gives way."""
    machine.start(cap=1, prestarts=1, extra=1, lent=0, reclaiming=0)
    machine.lend_run(ROOMS[0])
    machine.begin_run(ROOMS[1])
    machine.lend_run(ROOMS[1])
    machine.submit_to(ROOMS[2])
    assert machine.prestarts == {ROOMS[2]}
    machine.reclaim_run(ROOMS[0])
    machine.reclaim_run(ROOMS[1])


RARE: dict[str, Callable[[Lending], None]] = {
    "drained while a run waits for its slot back": _then(Lending.drain),
    "resumed on drain": _then(Lending.drain),
    "resumed on finish": _then(lambda m: m.finish_run(ROOMS[1], stop=False)),
    "resumed on lend": _then(lambda m: m.begin_run(ROOMS[1]), lambda m: m.lend_run(ROOMS[1])),
    "resumed on resize": _then(lambda m: m.resize(2)),
    "went on while reclaiming": _then(lambda m: m.go_on(ROOMS[0])),
    "reclaim asked again": _then(lambda m: m.reclaim_run(ROOMS[0])),
    "a reclaimer finished": _then(lambda m: m.finish_run(ROOMS[0], stop=False)),
    "a reclaimer stopped": _then(lambda m: m.finish_run(ROOMS[0], stop=True)),
    "a prestart gave way to a reclaimer": _prestart_gives_way,
}
"""The rarest interleavings, each as a sequence of the machine's steps (with its
checks) that takes the path it is named after."""


@pytest.mark.parametrize("name", sorted(RARE))
def test_rare_interleaving(name: str) -> None:
    seen: list[str] = []

    class Recording(Lending):
        def path(self, name: str) -> None:
            seen.append(name)  # (event() is for a hypothesis run only)
            assert name in PATHS, name

    machine = Recording()
    machine.slots_add_up()
    RARE[name](machine)
    machine.slots_add_up()
    machine.teardown()
    assert name in seen, seen


def test_every_path_is_reached() -> None:
    """Each path of :data:`PATHS` is taken by the generator (derandomized, so the
    same examples every time) but :data:`TOO_RARE`, which :func:`test_rare_interleaving`
    takes: a check on a path never taken passes whatever the scheduler does there."""
    seen: set[str] = set()

    class Recording(Lending):
        def path(self, name: str) -> None:
            super().path(name)
            seen.add(name)

    run_state_machine_as_test(
        Recording, settings=settings(SETTINGS, max_examples=300, derandomize=True, database=None)
    )
    assert TOO_RARE.issubset(RARE)
    assert PATHS - seen <= TOO_RARE, sorted(PATHS - seen - TOO_RARE)

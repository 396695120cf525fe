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

At the end it finishes every run not reclaiming and checks every reclaimer
resumed (then finishes them too): no reclaimer waits forever once slots free.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bridge.core.model import RoomKey
from dispatcher.limits import DispatchLimits
from dispatcher.room import BeginPrestart, CancelPrestart, StartRun
from dispatcher.scheduler import Action, Scheduler
from dispatcher.status import Reclaimed
from tests.dispatcher.fakes import Messages, room

ROOMS = [room(n) for n in range(5)]
HELD, LENT, RECLAIMING = "held", "lent", "reclaiming"


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

    @initialize(cap=st.integers(1, 3), prestarts=st.integers(0, 3))
    def start(self, cap: int, prestarts: int) -> None:
        self.cap = cap
        limits = DispatchLimits(1.0, 3.0, 3, cap)
        self.scheduler = Scheduler(limits, max_prestarts=min(prestarts, cap))
        self.apply(self.scheduler.set_capacity(cap, self.now))

    def held(self) -> int:
        return sum(1 for s in self.runs.values() if s == HELD)

    def apply(self, actions: list[Action]) -> None:
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
        self.apply(self.scheduler.submit(self.messages(ROOMS[n]), self.now))

    @rule(dt=st.sampled_from([0.5, 1.5, 4.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.apply(self.scheduler.fire_timers(self.now))

    @precondition(lambda self: any(k not in self.begun for k in self.runs))
    @rule(data=st.data())
    def begin(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(k for k in self.runs if k not in self.begun)))
        assert self.scheduler.begin(key)
        self.begun.add(key)

    @precondition(lambda self: any(s == HELD for k, s in self.runs.items() if k in self.begun))
    @rule(data=st.data())
    def lend(self, data: st.DataObject) -> None:
        key = data.draw(
            st.sampled_from(
                sorted(k for k, s in self.runs.items() if s == HELD and k in self.begun)
            )
        )
        self.runs[key] = LENT
        self.apply(self.scheduler.lend(key, self.now))

    @precondition(lambda self: any(s != HELD for s in self.runs.values()))
    @rule(data=st.data())
    def reclaim(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(k for k, s in self.runs.items() if s != HELD)))
        again = self.runs[key] == RECLAIMING
        ahead, actions = self.scheduler.reclaim(key, self.now)
        self.apply(actions)
        if again:
            assert ahead == self.queue.index(key)
        elif ahead is None:
            assert not self.queue or self.draining, "reclaimed at once past waiting reclaimers"
            self.runs[key] = HELD
        else:
            assert ahead == len(self.queue)
            self.queue.append(key)
            self.runs[key] = RECLAIMING

    @precondition(lambda self: any(s != HELD for s in self.runs.values()))
    @rule(data=st.data())
    def went_on(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(k for k, s in self.runs.items() if s != HELD)))
        reclaiming = self.runs[key] == RECLAIMING
        actions = self.scheduler.went_on(key)
        assert actions == ([Reclaimed(key)] if reclaiming else []), actions
        if reclaiming:
            self.queue.remove(key)
        self.runs[key] = HELD

    @precondition(lambda self: bool(self.begun))
    @rule(data=st.data(), stop=st.booleans())
    def finish(self, data: st.DataObject, stop: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.begun)))
        if stop:
            self.scheduler.stop(key)  # the run winds down, then ends
            self.apply(self.scheduler.take_actions())
        self.end(key)

    def end(self, key: RoomKey) -> None:
        del self.runs[key]
        self.begun.discard(key)
        if key in self.queue:
            self.queue.remove(key)
        self.apply(self.scheduler.run_finished(key, self.now))

    @precondition(lambda self: not self.draining)
    @rule()
    def drain(self) -> None:
        self.scheduler.drain()
        self.draining = True
        self.apply(self.scheduler.take_actions())
        for key in sorted(k for k in self.runs if k not in self.begun):
            # Granted, not begun: it never begins (its batch queues again) and ends.
            assert not self.scheduler.begin(key)
            self.end(key)
        assert not self.queue, "a reclaimer still waits once draining"

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
        # Everything not waiting for its slot back ends: every reclaimer resumes.
        for key in sorted(self.runs):
            if self.runs[key] != RECLAIMING:
                if key not in self.begun:
                    assert self.scheduler.begin(key)
                    self.begun.add(key)
                self.end(key)
        assert not self.queue, f"reclaimers left waiting: {self.queue}"
        for key in sorted(self.runs):
            assert self.runs[key] == HELD
            self.end(key)


Lending.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLending = Lending.TestCase

"""Property test: a window that follows typing under every during-run mode, on one room.

Random messages from three senders in ``queue``, ``steer`` and ``interrupt``
mode, typing that changes, deletions, ticks at the armed times, grants, run
ends and answers to steer offers. Checked after each step: nothing is
dispatched twice or lost (every message not deleted is delivered or still
held); a gathering batch always has an armed timer no later than its
deadline, and that deadline never lies past its first message plus max
wait. At the end, everyone stops typing and every message not deleted runs.
"""

from __future__ import annotations

import heapq
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.model import Message, MessageId, RoomId, RoomKey, TransportName, UserId
from dispatcher.limits import DispatchLimits
from dispatcher.policy import DuringRun
from dispatcher.room import ArmTimer, Effect, Phase, Room, StartRun
from tests.dispatcher.fakes import Messages

KEY = RoomKey(TransportName("matrix"), RoomId("!r"))
LIMITS = DispatchLimits(coalesce_s=1.0, max_wait_s=3.0, max_batch=3, max_concurrent_runs=1)
IDLE = 0.3
USERS = ("alice", "bob", "carol")

op = st.one_of(
    st.tuples(
        st.just("msg"), st.floats(0, 0.5), st.sampled_from(USERS), st.sampled_from(list(DuringRun))
    ),
    st.tuples(st.just("type"), st.frozensets(st.sampled_from(USERS).map(UserId))),
    st.tuples(st.just("time"), st.floats(0, 2)),
    st.tuples(st.just("grant")),
    st.tuples(st.just("finish")),
    st.tuples(st.just("answer"), st.booleans()),
    st.tuples(st.just("delete"), st.integers(0, 30)),
)


class Harness:
    def __init__(self) -> None:
        self.room = Room(KEY, LIMITS, idle_s=IDLE)
        self.make = Messages()
        self.now = 0.0
        self.timers: list[float] = []
        self.submitted: list[Message] = []
        self.arrived: dict[MessageId, float] = {}
        self.deleted: set[MessageId] = set()
        self.delivered: list[Message] = []

    def apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, ArmTimer):
                heapq.heappush(self.timers, effect.at)
            elif isinstance(effect, StartRun):
                self.delivered.extend(effect.batch.messages)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while self.timers and self.timers[0] <= self.now:
            self.apply(self.room.tick(heapq.heappop(self.timers)))

    def step(self, o: tuple[Any, ...]) -> None:
        room = self.room
        match o:
            case ("msg", float(dt), str(sender), DuringRun() as mode):
                self.advance(dt)
                m = self.make(KEY, sender=sender)
                self.submitted.append(m)
                self.arrived[m.id] = self.now
                self.apply(room.message(m, self.now, mode))
            case ("type", frozenset() as users):
                self.apply(room.typing(users, self.now))
            case ("time", float(seconds)):
                self.advance(seconds)
            case ("grant",) if room.ready:
                self.apply(room.slot_granted(self.now))
                room.begin()
            case ("finish",) if room.run is not None:
                self.apply(room.run_finished(self.now))
            case ("answer", bool(taken)) if room.offered is not None:
                batch = room.offered
                _, effects = room.steer_answered(batch, taken)
                if taken:
                    self.delivered.extend(batch.messages)
                self.apply(effects)
            case ("delete", int(pick)) if self.submitted:
                m = self.submitted[pick % len(self.submitted)]
                removed, effects = room.remove(m, self.now)
                if removed:
                    self.deleted.add(m.id)
                self.apply(effects)

    def check(self) -> None:
        room = self.room
        if room.phase is Phase.GATHERING:
            deadline = room.deadline
            assert deadline is not None
            assert self.timers, "a window with no timer"
            assert min(self.timers) <= deadline, "a window whose timer comes late"
            first = min(self.arrived[m.id] for m in self.submitted if self.waits(m))
            assert deadline <= first + LIMITS.max_wait_s + 1e-9, "held past max wait"
        ids = [m.id for m in self.delivered]
        assert len(ids) == len(set(ids)), "a message was dispatched twice"
        for m in self.submitted:
            if m.id not in self.deleted:
                assert m in self.delivered or room.holds(m.id), f"lost {m.id}"

    def waits(self, m: Message) -> bool:
        return m.id not in self.deleted and m not in self.delivered and self.room.holds(m.id)


@settings(max_examples=400, deadline=None)
@given(st.lists(op, max_size=60))
def test_typing_windows_in_every_mode_lose_nothing_and_keep_max_wait(
    ops: list[tuple[Any, ...]],
) -> None:
    h = Harness()
    for o in ops:
        h.step(o)
        h.check()
    h.step(("type", frozenset()))
    for _ in range(60):
        h.step(("answer", True))
        h.step(("finish",))
        h.step(("grant",))
        h.advance(LIMITS.max_wait_s)
        h.check()
    assert [m for m in h.submitted if m.id not in h.deleted] == sorted(
        h.delivered, key=lambda m: m.id
    )
    assert h.room.idle

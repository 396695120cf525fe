"""Review 4: windows counted from arrival (``arrived`` before ``now``), at random.

Random submissions with arrivals out of order, older than the window, or later
than now; ticks at the armed times; grants, run ends, steering, deletions.
Checked after each step: every message is in exactly one started/offered batch
or still waits, in submission order; a gathering room (or a gathering steer
batch) always has an armed timer no later than its deadline, so it is never
stuck; a room becomes ready only once its window closed or it is full.
"""

from __future__ import annotations

import heapq
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.model import Message, MessageId, RoomId, RoomKey, TransportName
from dispatcher.limits import DispatchLimits
from dispatcher.policy import DuringRun
from dispatcher.room import ArmTimer, Effect, Phase, RequestSlot, Room, StartRun, SteerRun
from tests.dispatcher.fakes import Messages

KEY = RoomKey(TransportName("t"), RoomId("r"))

LIMITS = DispatchLimits(coalesce_s=1.0, max_wait_s=3.0, max_batch=3, max_concurrent_runs=1)

op = st.one_of(
    st.tuples(
        st.just("msg"), st.floats(0, 0.5), st.floats(-5, 1), st.sampled_from(list(DuringRun))
    ),
    st.tuples(st.just("time"), st.floats(0, 2)),
    st.tuples(st.just("grant")),
    st.tuples(st.just("finish")),
    st.tuples(st.just("answer"), st.booleans()),
    st.tuples(st.just("delete"), st.integers(0, 30)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(op, max_size=60))
def test_arrivals_never_lose_double_or_strand_a_message(
    ops: list[tuple[Any, ...]],
) -> None:
    """Found in review round 4."""
    make = Messages()
    room = Room(KEY, LIMITS)
    now = 0.0
    timers: list[float] = []
    submitted: list[Message] = []
    deleted: set[MessageId] = set()
    delivered: list[Message] = []
    ready_requested = False
    n = 0

    def apply(effects: list[Effect]) -> None:
        nonlocal ready_requested
        for e in effects:
            if isinstance(e, ArmTimer):
                heapq.heappush(timers, e.at)
            elif isinstance(e, RequestSlot):
                ready_requested = True
            elif isinstance(e, StartRun):
                delivered.extend(e.batch.messages)
            elif isinstance(e, SteerRun):
                pass

    for o in ops:
        kind = o[0]
        if kind == "msg":
            _, dt, back, mode = o
            now += dt
            n += 1
            m = make(KEY)
            submitted.append(m)
            apply(room.message(m, now, mode, now + back))
        elif kind == "time":
            now += o[1]
            while timers and timers[0] <= now:
                at = heapq.heappop(timers)
                apply(room.tick(max(at, 0.0)))
        elif kind == "grant" and room.ready:
            ready_requested = False
            apply(room.slot_granted(now))
            room.begin()
        elif kind == "finish" and room.run is not None:
            apply(room.run_finished(now))
        elif kind == "answer" and room.offered is not None:
            batch = room.offered
            _taken, effects = room.steer_answered(batch, o[1])
            if o[1]:
                delivered.extend(batch.messages)
            apply(effects)
        elif kind == "delete" and submitted:
            m = submitted[o[1] % len(submitted)]
            removed, effects = room.remove(m, now)
            if removed:
                deleted.add(m.id)
            apply(effects)
        # Invariants.
        if room.phase is Phase.GATHERING:
            deadline = room.deadline
            assert deadline is not None
            assert timers
            assert min(timers) <= deadline + 1e-9, (timers, deadline, now)
        waiting = [m for m in submitted if room.holds(m.id) and m not in delivered]
        ids = [m.id for m in delivered]
        assert len(ids) == len(set(ids)), "a message was dispatched twice"
        for m in submitted:
            if m.id in deleted:
                continue
            assert m in delivered or room.holds(m.id), f"lost {m.id}"
        del waiting

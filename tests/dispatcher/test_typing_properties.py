"""Property test: windows that follow typing, on the pure scheduler with exact times.

Random steps submit messages from several senders to conversations of two
channels (one channel's conversations follow typing, one room of it does
not), change who types in a channel, move time (every timer fires exactly
when due, as with the manual clock) and end runs. A model predicts each open
batch's deadline: following typing, ``first + max_wait`` while a sender of it
types, else ``min(quiet + idle, first + max_wait)`` where ``quiet`` is its last
message or the moment its last typing sender stopped; plain,
``min(last + coalesce, first + max_wait)``. Checked after every step:

- never two runs in a room; each run is the batch the model expects;
- a batch starts exactly at its deadline (or at once when full), never
  before, and no open batch is past its deadline: max wait always holds;
- nothing lost: at the end every message ran exactly once, in order (but
  those deleted while waiting: a batch that loses its typing sender's
  messages is quiet from then on).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridge.core.model import Message, RoomId, RoomKey, TransportName, UserId
from dispatcher.limits import DispatchLimits
from dispatcher.room import StartRun
from dispatcher.scheduler import Action, Scheduler
from tests.dispatcher.fakes import Messages

LIMITS = DispatchLimits(coalesce_s=1.5, max_wait_s=6.0, max_batch=3, max_concurrent_runs=10)
IDLE = 0.3
MATRIX = RoomKey(TransportName("matrix"), RoomId("!a"))
OTHER = RoomKey(TransportName("matrix"), RoomId("!b"))
ROOMS = (MATRIX, MATRIX.in_thread("$t"), OTHER)
FOLLOWING = {MATRIX: IDLE, MATRIX.in_thread("$t"): IDLE}
"""OTHER keeps the plain window."""
USERS = ("alice", "bob", "carol")


@dataclass
class Conversation:
    open: list[Message] = field(default_factory=list)
    first: float = 0.0
    quiet: float = 0.0
    queued: list[Message] = field(default_factory=list)
    running: tuple[Message, ...] | None = None
    ran: list[Message] = field(default_factory=list)


class Model:
    def __init__(self) -> None:
        self.now = 0.0
        self.typing: dict[RoomKey, frozenset[UserId]] = {}
        self.rooms = {key: Conversation() for key in ROOMS}
        self.submitted: dict[RoomKey, list[Message]] = {key: [] for key in ROOMS}

    def deadline(self, key: RoomKey) -> float:
        c = self.rooms[key]
        latest = c.first + LIMITS.max_wait_s
        idle = FOLLOWING.get(key)
        if idle is None:
            return min(c.quiet + LIMITS.coalesce_s, latest)
        if self.sender_typing(key):
            return latest
        return min(c.quiet + idle, latest)

    def sender_typing(self, key: RoomKey) -> bool:
        if key not in FOLLOWING:
            return False
        typing = self.typing.get(key.channel, frozenset())
        return any(m.sender in typing for m in self.rooms[key].open)


class Harness:
    def __init__(self) -> None:
        self.model = Model()
        self.scheduler = Scheduler(LIMITS, idle_of=FOLLOWING.get)
        self.make = Messages()

    def apply(self, actions: list[Action]) -> None:
        for action in actions:
            assert isinstance(action, StartRun)
            key = action.batch.room
            c = self.model.rooms[key]
            assert c.running is None, "two runs in one room"
            if c.open:
                expected = tuple(c.open)
                if len(c.open) < LIMITS.max_batch:
                    assert self.model.now == self.model.deadline(key), "started off its deadline"
                c.open = []
            else:
                expected = tuple(c.queued[: LIMITS.max_batch])
                del c.queued[: LIMITS.max_batch]
            assert action.batch.messages == expected
            c.running = expected
            c.ran += expected

    def check(self) -> None:
        for key, c in self.model.rooms.items():
            if c.open:
                assert self.model.now < self.model.deadline(key), "an open batch is overdue"
                assert self.model.now < c.first + LIMITS.max_wait_s

    def submit(self, key: RoomKey, sender: str) -> None:
        message = self.make(key, sender=sender)
        self.model.submitted[key].append(message)
        c = self.model.rooms[key]
        if c.running is not None:
            c.queued.append(message)
        else:
            if not c.open:
                c.first = self.model.now
            c.open.append(message)
            c.quiet = self.model.now
        self.apply(self.scheduler.submit(message, self.model.now))

    def type(self, channel: RoomKey, users: frozenset[UserId]) -> None:
        was = {key: self.model.sender_typing(key) for key in ROOMS}
        self.model.typing[channel] = users
        for key in ROOMS:
            if key.channel == channel and was[key] and not self.model.sender_typing(key):
                self.model.rooms[key].quiet = max(self.model.rooms[key].quiet, self.model.now)
        self.apply(self.scheduler.typing(channel, users, self.model.now))

    def delete(self, key: RoomKey, pick: int) -> None:
        """A waiting message is deleted: a batch left with no sender typing is quiet
        from now on (as if its typing sender stopped)."""
        c = self.model.rooms[key]
        waiting = c.open + c.queued
        if not waiting:
            return
        message = waiting[pick % len(waiting)]
        was = self.model.sender_typing(key)
        if message in c.open:
            c.open.remove(message)
            if c.open and was and not self.model.sender_typing(key):
                c.quiet = max(c.quiet, self.model.now)
        else:
            c.queued.remove(message)
        self.model.submitted[key].remove(message)
        assert self.scheduler.remove(message, self.model.now)
        self.apply(self.scheduler.take_actions())

    def advance(self, seconds: float) -> None:
        target = self.model.now + seconds
        while (due := self.scheduler.next_deadline()) is not None and due <= target:
            self.model.now = max(self.model.now, due)
            self.apply(self.scheduler.fire_timers(self.model.now))
        self.model.now = target

    def finish(self, key: RoomKey) -> None:
        c = self.model.rooms[key]
        if c.running is None:
            return
        c.running = None
        self.apply(self.scheduler.run_finished(key, self.model.now))


steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from(ROOMS), st.sampled_from(USERS)),
        st.tuples(
            st.just("type"),
            st.sampled_from((MATRIX, OTHER)),
            st.frozensets(st.sampled_from(USERS).map(UserId)),
        ),
        st.tuples(st.just("advance"), st.sampled_from((0.05, 0.1, 0.3, 0.7, 1.5, 4.0))),
        st.tuples(st.just("finish"), st.sampled_from(ROOMS)),
        st.tuples(st.just("delete"), st.sampled_from(ROOMS), st.integers(0, 9)),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(steps)
@example(
    [  # the typing sender's message deleted: the rest is quiet from then, not held
        ("type", MATRIX, frozenset({UserId("alice")})),
        ("submit", MATRIX, "alice"),
        ("submit", MATRIX, "bob"),
        ("delete", MATRIX, 0),
        ("advance", 1.5),
    ]
)
def test_typing_windows_lose_nothing_and_keep_their_deadlines(
    plan: list[tuple[object, ...]],
) -> None:
    h = Harness()
    for step in plan:
        match step:
            case ("submit", RoomKey() as key, str(sender)):
                h.submit(key, sender)
            case ("type", RoomKey() as channel, frozenset() as users):
                h.type(channel, users)
            case ("advance", float(seconds)):
                h.advance(seconds)
            case ("finish", RoomKey() as key):
                h.finish(key)
            case ("delete", RoomKey() as key, int(pick)):
                h.delete(key, pick)
        h.check()
    # Everyone stops typing; every run ends; every window closes.
    for channel in (MATRIX, OTHER):
        h.type(channel, frozenset())
    for _ in range(100):
        for key in ROOMS:
            h.finish(key)
        h.advance(LIMITS.max_wait_s)
        h.check()
    for key, c in h.model.rooms.items():
        assert c.ran == h.model.submitted[key], "a message was lost, repeated or reordered"
    assert h.scheduler.room_count == 0

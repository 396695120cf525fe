"""The global FIFO slot pool."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.model import RoomKey
from dispatcher.slots import SlotPool
from tests.dispatcher.fakes import room

A, B, C, D = (room(x) for x in "abcd")


def test_grants_up_to_capacity_then_queues_in_order() -> None:
    pool = SlotPool(2)
    assert pool.request(A) == [A]
    assert pool.request(B) == [B]
    assert pool.request(C) == []
    assert pool.request(D) == []
    assert (pool.in_use, pool.waiting) == (2, 2)
    assert pool.release(B) == [C]
    assert pool.release(A) == [D]
    assert pool.release(C) == []
    assert (pool.in_use, pool.waiting) == (1, 0)


def test_withdraw_gives_up_the_place() -> None:
    pool = SlotPool(1)
    pool.request(A)
    pool.request(B)
    pool.request(C)
    pool.withdraw(B)
    assert not pool.is_waiting(B)
    assert pool.release(A) == [C]
    pool.withdraw(D)  # not waiting: nothing to do


def test_resize_opens_and_closes_slots() -> None:
    pool = SlotPool(0)
    assert pool.request(A) == []
    assert pool.request(B) == []
    assert pool.resize(1) == [A]
    assert pool.resize(0) == []  # nothing is revoked
    assert pool.holds(A)
    assert pool.release(A) == []  # closed: B keeps waiting
    assert pool.resize(3) == [B]


def test_take_holds_a_slot_beyond_the_capacity_and_grants_wait_below_it() -> None:
    pool = SlotPool(1)
    assert pool.request(A) == [A]
    pool.take(B)  # an adopted run: it is going already
    assert (pool.in_use, pool.capacity) == (2, 1)
    assert pool.request(C) == []
    assert pool.release(A) == []  # still at the cap
    assert pool.release(B) == [C]
    with pytest.raises(RuntimeError, match="already"):
        pool.take(C)


def test_misuse_is_reported() -> None:
    pool = SlotPool(1)
    pool.request(A)
    with pytest.raises(RuntimeError, match="already"):
        pool.request(A)
    with pytest.raises(RuntimeError, match="holds no slot"):
        pool.release(B)
    with pytest.raises(ValueError, match="negative"):
        SlotPool(-1)


def test_a_room_at_its_cap_is_passed_over_and_keeps_its_place() -> None:
    """Threads of one room share its cap; a waiting thread of a full room lets
    another room's conversation by, and is first once its room has room."""
    a1, a2, a3 = (A.in_thread(t) for t in ("1", "2", "3"))
    pool = SlotPool(3, room_cap=lambda key: 2 if key == A else None)
    assert pool.request(a1) == [a1]
    assert pool.request(a2) == [a2]
    assert pool.request(a3) == []  # room A holds its two
    assert pool.request(B) == [B]  # a free slot goes past it
    assert pool.request(C) == []  # the pool is full
    assert pool.release(a1) == [a3]  # first in line, and A has room again
    assert pool.release(B) == [C]
    pool.take(a1)  # an adopted run goes beyond the room's cap
    assert pool.request(a2.in_thread("4")) == []
    assert pool.release(a3) == []  # A still holds two (a2 and a1)
    assert pool.release(a2) == [A.in_thread("4")]


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.booleans(), st.sampled_from("ab"), st.sampled_from("123")), max_size=40),
    st.integers(1, 3),
    st.integers(1, 2),
)
def test_room_caps_hold_and_no_slot_idles_while_someone_could_take_it(
    steps: list[tuple[bool, str, str]], capacity: int, cap: int
) -> None:
    """Random requests and releases: no room ever holds more than its cap, the
    pool never more than its capacity, and after every step a free slot means
    every waiting conversation's room is full."""
    pool = SlotPool(capacity, room_cap=lambda key: cap)
    holders: set[RoomKey] = set()
    for request, name, thread in steps:
        key = room(name).in_thread(thread)
        if request and not pool.holds(key) and not pool.is_waiting(key):
            holders |= set(pool.request(key))
        elif not request and key in holders:
            holders.remove(key)
            holders |= set(pool.release(key))
        assert len(holders) == pool.in_use <= capacity
        for name_ in "ab":
            assert sum(1 for h in holders if h.channel == room(name_)) <= cap
        if pool.in_use < capacity:
            for name_ in "ab":
                waiting = [room(name_).in_thread(t) for t in "123"]
                if any(pool.is_waiting(w) for w in waiting):
                    assert sum(1 for h in holders if h.channel == room(name_)) == cap


def test_a_grant_looks_only_as_far_as_the_first_conversation_it_can_serve() -> None:
    """A long queue: releasing a slot costs the conversations passed over (their
    rooms at their caps), not the whole queue (the service asks every room)."""
    asked: list[RoomKey] = []

    def room_cap(key: RoomKey) -> int | None:
        asked.append(key)
        return 1 if key == A else None

    pool = SlotPool(2, room_cap=room_cap)
    pool.request(A.in_thread("running"))
    pool.request(B)
    pool.request(A.in_thread("held back"))  # its room is at its cap
    waiting = [room(f"w{n}") for n in range(1000)]
    for key in waiting:
        pool.request(key)
    asked.clear()
    assert pool.release(B) == [waiting[0]]
    assert len(asked) <= 4, f"asked about {len(asked)} conversations for one grant"
    asked.clear()
    assert pool.release(waiting[0]) == [waiting[1]]
    assert len(asked) <= 4

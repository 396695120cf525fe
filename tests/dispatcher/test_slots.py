"""The global FIFO slot pool."""

from __future__ import annotations

import pytest

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

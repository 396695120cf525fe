from __future__ import annotations

import random

import pytest

from transports.backoff import Backoff


def test_doubles_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(base=0.5, cap=4.0, rand=lambda: 1.0)
    assert [backoff.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.failures == 6
    backoff.reset()
    assert backoff.failures == 0
    assert backoff.next_delay() == 0.5


def test_jitter_stays_between_half_the_ceiling_and_the_ceiling() -> None:
    draws = iter([0.0, 0.5])
    backoff = Backoff(base=1.0, cap=10.0, rand=lambda: next(draws))
    assert backoff.next_delay() == 0.5  # never zero, even with the lowest draw
    assert backoff.next_delay() == 1.5
    seeded = Backoff(base=1.0, cap=8.0, rand=random.Random(7).random)
    for ceiling in [1, 2, 4, 8, 8, 8]:
        assert ceiling / 2 <= seeded.next_delay() <= ceiling


def test_many_failures_do_not_overflow() -> None:
    backoff = Backoff(base=1.0, cap=30.0, rand=lambda: 1.0)
    for _ in range(5000):
        delay = backoff.next_delay()
    assert delay == 30.0


@pytest.mark.parametrize(("base", "cap"), [(0, 1), (-1, 1), (2, 1)])
def test_rejects_nonsense(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="base"):
        Backoff(base=base, cap=cap)

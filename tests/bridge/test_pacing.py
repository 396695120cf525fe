"""The per-transport budget of cosmetic updates, on an explicit clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bridge.outbound.pacing import RECOVERY_S, Pacing


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_steady_rate() -> None:
    clock = Clock()
    pacing = Pacing(60.0, clock, burst=3)
    assert [pacing.try_edit() for _ in range(4)] == [True, True, True, False]
    clock.now += 1.0
    assert [pacing.try_edit() for _ in range(2)] == [True, False]


def test_a_rate_limit_pauses_then_halves_the_rate_then_recovers() -> None:
    clock = Clock()
    pacing = Pacing(60.0, clock, burst=1)
    pacing.rate_limited(10.0)
    assert pacing.limited()
    clock.now += 9.9
    assert not pacing.try_edit()
    clock.now += 0.1
    assert not pacing.limited()
    assert pacing.rate_per_s == 0.5
    clock.now += 2.0  # one edit per 2 s now
    assert pacing.try_edit()
    clock.now += 1.0
    assert not pacing.try_edit()
    clock.now += RECOVERY_S
    assert pacing.try_edit()
    assert pacing.rate_per_s == 1.0  # a quiet minute: the full rate again


Step = tuple[str, float]
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("wait"), st.floats(0.0, 30.0)),
        st.tuples(st.just("edit"), st.just(0.0)),
        st.tuples(st.just("limited"), st.floats(0.0, 20.0)),
    ),
    max_size=200,
)


@given(steps=STEPS, per_minute=st.floats(1.0, 600.0), burst=st.integers(1, 5))
def test_never_more_than_the_budget_and_nothing_while_limited(
    steps: list[Step], per_minute: float, burst: int
) -> None:
    """In every window, grants <= burst + rate * length; none while the server said wait."""
    clock = Clock()
    pacing = Pacing(per_minute, clock, burst=burst)
    grants: list[float] = []
    blocked_until = float("-inf")
    for action, value in steps:
        if action == "wait":
            clock.now += value
        elif action == "limited":
            pacing.rate_limited(value)
            blocked_until = max(blocked_until, clock.now + value)
        elif pacing.try_edit():
            assert clock.now >= blocked_until
            grants.append(clock.now)
    rate = per_minute / 60
    for i, start in enumerate(grants):
        for j in range(i, len(grants)):
            assert j - i + 1 <= burst + rate * (grants[j] - start) + 1e-9

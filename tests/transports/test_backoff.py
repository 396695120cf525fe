from __future__ import annotations

import asyncio
import random

import pytest

from bridge.core.transport import RateLimited, TransportError, Undeliverable
from transports.backoff import Backoff, retry


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


class Attempts:
    """An operation that fails with the given errors, then returns ``"done"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def fixed_backoff() -> Backoff:
    return Backoff(base=1.0, cap=8.0, rand=lambda: 1.0)


async def test_retry_backs_off_until_it_works_then_resets() -> None:
    attempt, sleeps, backoff = Attempts(OSError("a"), OSError("b")), Sleeps(), fixed_backoff()
    assert await retry(attempt, what="x", backoff=backoff, sleep=sleeps) == "done"
    assert attempt.calls == 3
    assert sleeps.delays == [1.0, 2.0]
    assert backoff.failures == 0


async def test_retry_waits_out_a_rate_limit() -> None:
    attempt, sleeps = Attempts(RateLimited("slack", 30.0), OSError()), Sleeps()
    await retry(attempt, what="x", backoff=fixed_backoff(), sleep=sleeps)
    assert sleeps.delays == [30.0, 2.0]


async def test_retry_gives_up_on_fatal_errors_at_once() -> None:
    attempt, sleeps = Attempts(OSError(), Undeliverable("slack", "no such channel")), Sleeps()
    backoff = fixed_backoff()
    with pytest.raises(Undeliverable):
        await retry(attempt, what="x", backoff=backoff, fatal=(Undeliverable,), sleep=sleeps)
    assert attempt.calls == 2
    assert sleeps.delays == [1.0]


async def test_a_rate_limit_is_waited_out_even_when_its_base_class_is_fatal() -> None:
    # fatal=(TransportError,) means "refused for good"; a rate limit asks to wait.
    attempt, sleeps = Attempts(RateLimited("matrix", 12.0)), Sleeps()
    await retry(attempt, what="x", backoff=fixed_backoff(), fatal=(TransportError,), sleep=sleeps)
    assert (attempt.calls, sleeps.delays) == (2, [12.0])
    with pytest.raises(TransportError, match="refused"):
        await retry(
            Attempts(TransportError("matrix", "refused")),
            what="x",
            backoff=fixed_backoff(),
            fatal=(TransportError,),
            sleep=sleeps,
        )
    named = Attempts(RateLimited("matrix", 12.0))
    with pytest.raises(RateLimited):
        await retry(named, what="x", backoff=fixed_backoff(), fatal=(RateLimited,), sleep=sleeps)


async def test_retry_raises_the_last_error_after_its_attempts() -> None:
    attempt, sleeps = Attempts(OSError("1"), OSError("2"), OSError("3")), Sleeps()
    with pytest.raises(OSError, match="2"):
        await retry(attempt, what="x", backoff=fixed_backoff(), attempts=2, sleep=sleeps)
    assert attempt.calls == 2
    assert sleeps.delays == [1.0]


async def test_retry_is_cancelled_while_it_waits() -> None:
    attempt = Attempts(*[OSError()] * 10)
    waiting = asyncio.Event()

    async def sleep(delay: float) -> None:
        waiting.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(retry(attempt, what="x", backoff=fixed_backoff(), sleep=sleep))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert attempt.calls == 1

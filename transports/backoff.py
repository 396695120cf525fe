"""Exponential backoff with jitter, and one retry loop built on it.

For the reconnect and retry loops of the transports and the service: every
loop that tries again after a failure waits by :class:`Backoff`, and a loop
of the "until it works" kind is :func:`retry` rather than a copy of it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bridge.core.transport import RateLimited

log = logging.getLogger(__name__)

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]


class Backoff:
    """Delays that double per consecutive failure up to ``cap``, each drawn in ``[d/2, d]``.

    The jitter keeps many bridges that lost the same server at once from
    reconnecting in lockstep; the lower bound keeps a delay from collapsing
    to nothing, so a failing loop never spins. Call :meth:`reset` once a
    connection has proved healthy.
    """

    def __init__(
        self,
        base: float = 1.0,
        cap: float = 60.0,
        rand: Callable[[], float] | None = None,
    ) -> None:
        if base <= 0 or cap < base:
            raise ValueError("need 0 < base <= cap")
        self._base = base
        self._cap = cap
        # Injectable so tests can pin the draw; jitter, not cryptography.
        self._rand = rand or random.random
        self._failures = 0

    @property
    def failures(self) -> int:
        """Consecutive failures since the last success."""
        return self._failures

    def next_delay(self) -> float:
        """Record a failure; the seconds to wait before the next attempt."""
        # The exponent is bounded: 2**1000 overflows a float.
        ceiling = min(self._cap, self._base * 2.0 ** min(self._failures, 60))
        self._failures += 1
        return ceiling / 2 + ceiling / 2 * self._rand()

    def reset(self) -> None:
        """Record a success: the next failure starts from ``base`` again."""
        self._failures = 0


def _is_fatal(exc: Exception, fatal: tuple[type[Exception], ...]) -> bool:
    """``fatal`` covers ``exc``; a rate limit only when it is named itself.

    ``fatal=(TransportError,)`` means "refused for good", and a rate limit,
    though a ``TransportError``, asks to wait, not to give up.
    """
    if not isinstance(exc, fatal):
        return False
    if isinstance(exc, RateLimited):
        return any(issubclass(kind, RateLimited) for kind in fatal)
    return True


async def retry(
    attempt: Callable[[], Awaitable[T]],
    *,
    what: str,
    backoff: Backoff,
    attempts: int | None = None,
    fatal: tuple[type[Exception], ...] = (),
    sleep: Sleep = asyncio.sleep,
) -> T:
    """Await ``attempt()`` until it returns, backing off between failures.

    ``what`` names the operation in the log ("matrix login"). Errors that
    are ``fatal`` (no retry can help: revoked credentials, ``Undeliverable``)
    propagate at once (a :class:`RateLimited` only if ``fatal`` names it or a
    subclass of it, not merely ``TransportError``), and so does the last
    error once ``attempts`` calls (None: no limit) have failed. After a
    :class:`RateLimited` the wait is at least its ``retry_after_s``. A
    success resets ``backoff``.
    Cancellation is no ``Exception``: it propagates from the attempt and
    from the wait alike.
    """
    failures = 0
    while True:
        try:
            result = await attempt()
        except Exception as exc:
            if _is_fatal(exc, fatal):
                raise
            failures += 1
            if attempts is not None and failures >= attempts:
                raise
            delay = backoff.next_delay()
            if isinstance(exc, RateLimited):
                delay = max(delay, exc.retry_after_s)
            log.warning(
                "%s failed (%s: %s); retry %d in %.1fs",
                what,
                type(exc).__name__,
                exc,
                failures,
                delay,
            )
            await sleep(delay)
        else:
            backoff.reset()
            return result

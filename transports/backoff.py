"""Exponential backoff with jitter, for the transports' reconnect and retry loops."""

from __future__ import annotations

import random
from collections.abc import Callable


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

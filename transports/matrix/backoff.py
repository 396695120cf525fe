"""Exponential backoff with jitter for reconnect and retry loops."""

from __future__ import annotations

import random


class Backoff:
    """Delays that double per failure up to ``cap``, each drawn in ``[d/2, d]``.

    The jitter keeps many bridges (or many rooms) that lost the same server
    from reconnecting in lockstep; the lower bound keeps a delay from
    collapsing to nothing, so a failing loop never spins.
    """

    def __init__(
        self, base: float = 1.0, cap: float = 60.0, rng: random.Random | None = None
    ) -> None:
        if base <= 0 or cap < base:
            raise ValueError("need 0 < base <= cap")
        self._base = base
        self._cap = cap
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._failures = 0

    @property
    def failures(self) -> int:
        """Consecutive failures since the last success."""
        return self._failures

    def next_delay(self) -> float:
        """Record a failure; the seconds to wait before the next attempt."""
        ceiling = min(self._cap, self._base * 2 ** min(self._failures, 30))
        self._failures += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        """Record a success: the next failure starts from ``base`` again."""
        self._failures = 0

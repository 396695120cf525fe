"""Exponential backoff with full jitter for the reconnect loop."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    """Delays that double per consecutive failure up to ``cap``, drawn uniformly below that.

    Full jitter keeps many bridges that lost Slack at the same moment from
    reconnecting in lockstep. ``reset()`` after a connection proved healthy.
    """

    base: float = 0.5
    cap: float = 60.0
    rand: Callable[[], float] = field(default=random.random)  # injectable for exact tests
    failures: int = 0

    def next_delay(self) -> float:
        """The delay before the next attempt; counts one more failure."""
        ceiling = min(self.cap, self.base * 2.0**self.failures)
        self.failures = min(self.failures + 1, 62)  # 2**63 overflows a float's exactness
        # Never zero: even with bad luck a failing peer is not hammered in a tight loop.
        return max(ceiling * self.rand(), self.base / 10)

    def reset(self) -> None:
        self.failures = 0

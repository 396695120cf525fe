"""How fast cosmetic updates may go to one chat server, shared by all its rooms.

Chat servers limit requests per bot, not per room: Slack's ``chat.update``
is Tier 3 (about 50 a minute per workspace), Synapse's default
``rc_message`` allows a burst of 10 and then one message every 5 seconds for
messages and edits together. Progress edits are the first thing to give: a
:class:`Pacing` per transport hands out edits from a token bucket, and when
the server answers "too many requests" it stops every cosmetic update until
``retry_after`` has passed and halves the edit rate, recovering step by step
while the server stays quiet. Answers never wait for it: they go through
the outbox (:mod:`bridge.outbound.outbox`), which honours the server's
``retry_after`` on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

SLOWEST_FACTOR = 1 / 8
"""After repeated rate limits the edit rate falls to this share at most."""
RECOVERY_S = 60.0
"""Each quiet period this long after a rate limit doubles the edit rate again."""


@dataclass(slots=True)
class Pacing:
    """A token bucket of progress edits for one transport, slowed by rate limits."""

    edits_per_minute: float
    clock: Callable[[], float]
    burst: float = 3.0
    """Edits that may go at once after a quiet spell."""
    _tokens: float = field(init=False)
    _updated: float = field(init=False)
    _blocked_until: float = field(init=False, default=float("-inf"))
    _factor: float = field(init=False, default=1.0)
    _slowed_at: float = field(init=False, default=float("-inf"))

    def __post_init__(self) -> None:
        if self.edits_per_minute <= 0 or self.burst < 1:
            raise ValueError("need edits_per_minute > 0 and burst >= 1")
        self._tokens = self.burst
        self._updated = self.clock()

    @property
    def rate_per_s(self) -> float:
        """Edits per second allowed, as of the last edit or rate limit."""
        return self.edits_per_minute / 60 * self._factor

    def limited(self) -> bool:
        """True while the server's last "too many requests" is in force."""
        return self.clock() < self._blocked_until

    def try_edit(self) -> bool:
        """Take one edit if the budget allows it now (never waits)."""
        now = self._refill()
        if now < self._blocked_until or self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def rate_limited(self, retry_after_s: float) -> None:
        """The server refused a request: pause cosmetics, then go slower."""
        now = self._refill()
        self._blocked_until = max(self._blocked_until, now + max(0.0, retry_after_s))
        self._tokens = 0.0
        self._factor = max(SLOWEST_FACTOR, self._factor / 2)
        self._slowed_at = now

    def _refill(self) -> float:
        now = max(self.clock(), self._updated)  # a clock never runs backwards here
        while self._factor < 1 and now - self._slowed_at >= RECOVERY_S:
            self._factor = min(1.0, self._factor * 2)
            self._slowed_at += RECOVERY_S
        # Tokens accrue only after a block ends: a pause is not saved up.
        start = max(self._updated, min(now, self._blocked_until))
        self._tokens = min(self.burst, self._tokens + (now - start) * self.rate_per_s)
        self._updated = now
        return now

"""Display names of Slack users, looked up with ``users.info`` and cached.

The lookup sits on the inbound path, before an event is acknowledged, so it
is bounded in time, never retried, never holds a lock, and a failure costs
only the name: the caller shows the user id instead. Failures are cached
briefly, so an outage or a rate limit is not asked again for every message.

A bound per lookup is not enough: Socket Mode serves envelopes one at a
time and Slack wants each acknowledged within 3 s, so waits for a slow
``users.info`` would add up along a queue of envelopes. All waits draw on
one :class:`WaitBudget`; once it is spent, names are not looked up (the
id is shown) until it has refilled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)

Lookup = Callable[[str], Awaitable[str | None]]
"""A user's display name, or None if it has none to show."""


class WaitBudget:
    """Seconds of waiting shared by all lookups: a bucket that refills at a steady rate.

    Over any stretch of ``t`` seconds the lookups together wait at most
    ``capacity_s + t * refill_per_s``; with the defaults, under a second
    within Slack's 3 s acknowledgement deadline, however many envelopes queue.
    """

    def __init__(
        self,
        capacity_s: float = 0.5,
        refill_per_s: float = 0.5 / 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._capacity = capacity_s
        self._rate = refill_per_s
        self._clock = clock
        self._level = capacity_s
        self._at = clock()

    def take(self, wanted_s: float) -> float:
        """Reserve up to ``wanted_s`` seconds; returns what was granted (maybe 0)."""
        now = self._clock()
        self._level = min(self._capacity, self._level + (now - self._at) * self._rate)
        self._at = now
        granted = max(0.0, min(wanted_s, self._level))
        self._level -= granted
        return granted

    def give_back(self, unused_s: float) -> None:
        """Return the part of a reservation that was not waited."""
        self._level = min(self._capacity, self._level + max(0.0, unused_s))


MIN_WAIT_S = 0.1
"""A lookup is not started with less than this to wait: it would rarely finish."""


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """How many names are kept, for how long, and how long one lookup may wait."""

    size: int = 1024
    ttl_s: float = 3600.0
    failure_ttl_s: float = 60.0
    """A failed (or cut short) lookup is not tried again for this long."""
    timeout_s: float = 1.0


class DisplayNames:
    """A bounded, expiring cache in front of a name lookup."""

    def __init__(
        self,
        lookup: Lookup,
        policy: CachePolicy = CachePolicy(),
        *,
        budget: WaitBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lookup = lookup
        self._policy = policy
        self._budget = budget or WaitBudget()
        self._clock = clock
        self._cache: OrderedDict[str, tuple[str | None, float]] = OrderedDict()
        self.lookups = 0
        """How many lookups were made (a test hook and a metric)."""
        self.skipped = 0
        """Resolves that looked nothing up because the wait budget was spent (a metric)."""

    async def resolve(self, user_ids: Iterable[str]) -> dict[str, str]:
        """Names of those ``user_ids`` that have one; unknown ones looked up concurrently.

        Waits at most what the shared budget grants; users whose lookup did
        not finish in it are left out (shown by id), like failed lookups.
        """
        wanted = list(dict.fromkeys(user_ids))
        missing = [u for u in wanted if self._cached(u) is None]
        if missing:
            await self._look_up(missing)
        names: dict[str, str] = {}
        for user in wanted:
            entry = self._cached(user)
            if entry is not None and entry[0] is not None:
                names[user] = entry[0]
        return names

    def _cached(self, user: str) -> tuple[str | None, float] | None:
        entry = self._cache.get(user)
        if entry is None or entry[1] <= self._clock():
            return None
        self._cache.move_to_end(user)
        return entry

    def _store(self, user: str, name: str | None, expiry: float) -> None:
        self._cache[user] = (name, expiry)
        self._cache.move_to_end(user)
        while len(self._cache) > self._policy.size:
            self._cache.popitem(last=False)

    async def _look_up(self, users: list[str]) -> None:
        granted = self._budget.take(self._policy.timeout_s)
        if granted < MIN_WAIT_S:
            self._budget.give_back(granted)
            self.skipped += 1
            log.debug("display names not looked up: the wait budget is spent")
            return
        # The loop's clock: the one asyncio.timeout cuts the lookups by.
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            found = await asyncio.gather(*(self._fetch(u, granted) for u in users))
        finally:
            self._budget.give_back(granted - (loop.time() - started))
        policy = self._policy
        for user, name in zip(users, found, strict=True):
            # A lookup cut short counts as a failure too: a slow Slack is
            # not asked again for every message.
            expiry = self._clock() + (policy.ttl_s if name is not None else policy.failure_ttl_s)
            self._store(user, name, expiry)

    async def _fetch(self, user: str, wait_s: float) -> str | None:
        self.lookups += 1
        try:
            async with asyncio.timeout(wait_s):
                return await self._lookup(user)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("no display name for %s: %s", user, type(exc).__name__)
            return None

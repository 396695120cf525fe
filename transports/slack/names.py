"""Display names of Slack users, looked up with ``users.info`` and cached.

The lookup sits on the inbound path, before an event is acknowledged, so it
is bounded in time, never retried, never holds a lock, and a failure costs
only the name: the caller shows the user id instead. Failures are cached
briefly, so an outage or a rate limit is not asked again for every message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger(__name__)

Lookup = Callable[[str], Awaitable[str | None]]
"""A user's display name, or None if it has none to show."""


class DisplayNames:
    """A bounded, expiring cache in front of a name lookup."""

    def __init__(
        self,
        lookup: Lookup,
        *,
        size: int = 1024,
        ttl_s: float = 3600.0,
        failure_ttl_s: float = 60.0,
        timeout_s: float = 1.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lookup = lookup
        self._size = size
        self._ttl = ttl_s
        self._failure_ttl = failure_ttl_s
        self._timeout = timeout_s
        self._clock = clock
        self._cache: OrderedDict[str, tuple[str | None, float]] = OrderedDict()
        self.lookups = 0
        """How many lookups were made (a test hook and a metric)."""

    async def resolve(self, user_ids: Iterable[str]) -> dict[str, str]:
        """Names of those ``user_ids`` that have one; unknown ones looked up concurrently."""
        wanted = list(dict.fromkeys(user_ids))
        missing = [u for u in wanted if self._cached(u) is None]
        if missing:
            found = await asyncio.gather(*(self._fetch(u) for u in missing))
            for user, name in zip(missing, found, strict=True):
                expiry = self._clock() + (self._ttl if name is not None else self._failure_ttl)
                self._store(user, name, expiry)
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
        while len(self._cache) > self._size:
            self._cache.popitem(last=False)

    async def _fetch(self, user: str) -> str | None:
        self.lookups += 1
        try:
            async with asyncio.timeout(self._timeout):
                return await self._lookup(user)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("no display name for %s: %s", user, type(exc).__name__)
            return None

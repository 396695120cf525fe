"""Live pages: one watcher polls the database and wakes every open event stream (docs/web.md).

One poll serves all browsers, whatever their number; streams are capped, so
a client that opens many is refused rather than served at others' cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

log = logging.getLogger(__name__)

MAX_STREAMS = 16
"""Live pages open at once, per process: each holds a connection of the private
listener ([http] max_connections, 64 by default), which health probes need too."""
KEEPALIVE_S = 2.0
"""Also how soon a stream its browser closed frees its place: the server does not read
a stream's connection, so only a failing write tells it the browser left (the second
after the close); a few bytes a second per stream."""


@dataclass(slots=True)
class Watcher:
    fingerprint: Callable[[], Awaitable[tuple[object, ...]]]
    poll_s: float
    version: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    streams: int = 0

    async def run(self) -> None:
        """Polls until cancelled; a failing database is logged and polled again."""
        last: tuple[object, ...] | None = None
        while True:
            try:
                now = await self.fingerprint()
            except Exception:
                log.warning("web console: reading the database failed", exc_info=True)
            else:
                if last is not None and now != last:
                    self.version += 1
                    self._changed.set()
                    self._changed = asyncio.Event()
                last = now
            await asyncio.sleep(self.poll_s)

    async def changed_after(self, version: int) -> int:
        """The version once it moved past ``version`` (callers bound the wait)."""
        if self.version == version:
            await self._changed.wait()
        return self.version


async def stream(request: web.Request, watcher: Watcher) -> web.StreamResponse:
    """``text/event-stream``: ``changed`` whenever the database changed, a comment to keep alive."""
    if watcher.streams >= MAX_STREAMS:
        raise web.HTTPServiceUnavailable(text="too many live pages open")
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    )
    watcher.streams += 1
    try:
        await response.prepare(request)
        seen = watcher.version
        while True:
            now = seen
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KEEPALIVE_S):
                    now = await watcher.changed_after(seen)
            await response.write(b"event: changed\ndata: .\n\n" if now != seen else b": alive\n\n")
            seen = now
    except (ConnectionResetError, ConnectionError):
        return response
    finally:
        watcher.streams -= 1

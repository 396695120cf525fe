"""Keeping the newest message seen in each channel and thread, off the event path.

The transport *notes* a message's ts once the sink has recorded it; this
saver writes the newest noted marks to the store (:class:`SeenMarks`) in one
transaction, coalescing what is noted meanwhile, so no event waits for the
write. A mark not written yet (a crash first) only makes the next catch-up
read from an older place, and the store's idempotent accept drops what was
handed over already. While a connection's catch-up has yet to finish a
channel, that channel's marks are held back (:meth:`MarkSaver.hold`): a live
message let through meanwhile must not move the mark past what the catch-up
has not read yet. See transports/slack/catch_up.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from bridge.core.model import ExternalMessageId, RoomId, RoomKey
from bridge.core.transport import SeenMarks
from transports.slack.catch_up import ts_key

log = logging.getLogger(__name__)

EVERY_S = 1.0
"""At most one write per this many seconds while messages keep coming."""


class MarkSaver:
    """Writes noted marks while :meth:`run` runs; the last ones when it is cancelled."""

    def __init__(self, store: SeenMarks, wall: Callable[[], float] = time.time) -> None:
        self._store = store
        self._wall = wall
        self._noted: dict[RoomKey, ExternalMessageId] = {}
        self._held: dict[RoomId, dict[RoomKey, ExternalMessageId]] = {}
        self._wake = asyncio.Event()

    def note(self, room: RoomKey, ts: str) -> None:
        """``ts`` was handed over in ``room`` (its thread, or "" for the channel). Never waits."""
        held = self._held.get(room.room_id)
        if held is not None:
            _keep_newer(held, room, ts)
        elif _keep_newer(self._noted, room, ts):
            self._wake.set()

    def hold(self, channels: Iterable[RoomId]) -> None:
        """Keep the marks noted in ``channels`` back until :meth:`release` (a catch-up
        is to read them); what was held for an earlier catch-up is forgotten."""
        self._held = {channel: {} for channel in channels}

    def release(self, channel: RoomId) -> None:
        """``channel`` is caught up: its held marks (and later ones) are written."""
        for room, ts in self._held.pop(channel, {}).items():
            self.note(room, ts)

    def forget_held(self) -> None:
        """A catch-up ended unfinished: its channels' held marks are not written (the
        next catch-up reads from the older marks; the store drops what it had)."""
        self._held = {}

    async def run(self) -> None:
        """Write noted marks until cancelled; then write what is left, once."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self._write()
                await asyncio.sleep(EVERY_S)
        finally:
            # Stopping: the newest marks spare the next start a longer read.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._write())

    async def _write(self) -> None:
        marks, self._noted = self._noted, {}
        if not marks:
            return
        try:
            await self._store.mark_seen(marks, self._wall())
        except Exception as exc:
            # Only costs a longer catch-up; keep them for the next write.
            log.warning("slack: could not save seen marks: %s: %s", type(exc).__name__, exc)
            for room, ts in marks.items():
                self.note(room, ts)


def _keep_newer(marks: dict[RoomKey, ExternalMessageId], room: RoomKey, ts: str) -> bool:
    """Put ``ts`` in ``marks`` unless an as new one is there; whether it was put."""
    kept = marks.get(room)
    if kept is None or (ts_key(ts) or (0, 0)) > (ts_key(kept) or (0, 0)):
        marks[room] = ExternalMessageId(ts)
        return True
    return False

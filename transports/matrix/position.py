"""Saving the sync position off the event loop, latest wins.

The sync loop *notes* a position once every message before it was durably accepted; this
saver writes it (with an fsync) from a worker thread, the newest of those noted meanwhile
next. A saved position is never ahead of the accepted messages (docs/deployment.md, "Inside
the Matrix transport").
"""

from __future__ import annotations

import asyncio
import logging

from transports.matrix.state import SyncPosition

log = logging.getLogger(__name__)


class PositionSaver:
    """Writes the newest noted position, one write at a time, while :meth:`run` runs."""

    def __init__(self, position: SyncPosition) -> None:
        self._position = position
        self._noted: str | None = None
        self._saved: str | None = None
        self._wake = asyncio.Event()
        self.writes = 0
        """How many writes reached the disk (coalescing shows as fewer writes than notes)."""

    def note(self, token: str) -> None:
        """``token`` may be saved: everything before it was accepted. Never waits."""
        self._noted = token
        self._wake.set()

    async def run(self) -> None:
        """Write noted positions until cancelled; then write the last one noted.

        A write under way when cancelled is waited for (a worker thread cannot
        be stopped halfway), so two writes never race for the file.
        """
        writing: asyncio.Task[None] | None = None
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                token = self._noted
                if token is not None and token != self._saved:
                    writing = asyncio.create_task(self._write(token), name="matrix-save-position")
                    # Shielded: cancelling the saver must not abandon the thread's write.
                    await asyncio.shield(writing)
        finally:
            if writing is not None and not writing.done():
                await asyncio.wait([writing])
            # Stopping: the last noted position is safe to keep, and saving it
            # spares the next start a replay.
            if self._noted is not None and self._noted != self._saved:
                await self._write(self._noted)

    async def _write(self, token: str) -> None:
        try:
            await asyncio.to_thread(self._position.save, token)
        except OSError as exc:
            # Only costs a longer replay after a restart; the next note tries again.
            log.error("matrix: could not save the sync position: %s", exc)
            return
        self._saved = token
        self.writes += 1

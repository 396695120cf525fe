"""Handing a burst of Socket Mode envelopes to the sink concurrently, in order.

Each envelope takes a ticket (:class:`Turns`) in arrival order: a message is handed over
once the envelope before it has handed its event over, an edit or a deletion once every
envelope before it has finished. Each envelope is acknowledged only once its own event is
recorded (docs/deployment.md, "Inside the Slack transport").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Turns:
    """Tickets in arrival order; only envelopes in flight are remembered."""

    def __init__(self) -> None:
        self._issued = 0
        self._not_handed: set[int] = set()
        self._unfinished: set[int] = set()
        self._changed = asyncio.Event()

    def take(self) -> int:
        """The next ticket, in arrival order (call before the envelope's first wait)."""
        self._issued += 1
        self._not_handed.add(self._issued)
        self._unfinished.add(self._issued)
        return self._issued

    async def message(self, ticket: int) -> None:
        """Wait until a message of ``ticket`` may go to the sink."""
        await self._until(lambda: min(self._not_handed, default=ticket) >= ticket)

    async def change(self, ticket: int) -> None:
        """Wait until an edit or deletion of ``ticket`` may go: all before have finished."""
        await self._until(lambda: min(self._unfinished, default=ticket) >= ticket)

    def handed(self, ticket: int) -> None:
        """``ticket``'s event goes to the sink now: the next message may go too."""
        self._not_handed.discard(ticket)
        self._notify()

    def finish(self, ticket: int) -> None:
        """``ticket`` is done with, whatever the outcome (handed or not)."""
        self._not_handed.discard(ticket)
        self._unfinished.discard(ticket)
        self._notify()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            await self._changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

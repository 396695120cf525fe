"""Handing a burst of Socket Mode envelopes to the sink concurrently, in order.

Envelopes used to be handled one after the other: each message's accept
(a commit with a disk sync) and acknowledgement came before the next
envelope was even read. Now every envelope is handled as soon as it arrives,
and each takes a ticket (:class:`Turns`) in arrival order, which orders the hand-overs:

- a message is handed to the sink once the envelope before it has handed
  its event over (or had none to hand over). The service's sink records a
  message before its first wait, so the store receives the messages of a
  burst in order, and its group commit records those that arrive together
  in one transaction;
- an edit or a deletion acts on what is already recorded, so it waits until
  every envelope before it has finished.

Each envelope is still acknowledged only once its own event is recorded.
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

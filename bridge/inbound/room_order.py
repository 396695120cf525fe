"""The hand-overs of one room's events, in the order their accepts were called.

Each accept takes a :class:`Turn` when it is called, before its first wait, and waits for the
turn before it only for its hand-over (queue, command, edit, deletion); a turn that ends early
still lets the next go only once the turns before it are done. A room is remembered only
while it has a turn under way (docs/live-runs.md, "One room's events stay in order").
"""

from __future__ import annotations

import asyncio

from bridge.core.model import RoomKey


class Turn:
    """One event's place in its room's order."""

    __slots__ = ("_before", "_done")

    def __init__(self, before: asyncio.Future[None] | None, done: asyncio.Future[None]) -> None:
        self._before = before
        self._done = done

    async def wait(self) -> None:
        """Return once every earlier turn of the room has ended."""
        if self._before is not None and not self._before.done():
            # Shielded: a cancelled wait must not cancel the turn before it.
            await asyncio.shield(self._before)

    def end(self) -> None:
        """This event's hand-over is over (or will not happen); idempotent.

        The next turn goes once this one and every one before it ended, so
        ending early never lets a later event overtake an earlier one.
        """
        before = self._before
        if before is None or before.done():
            _resolve(self._done)
        else:
            before.add_done_callback(lambda _: _resolve(self._done))


class RoomOrder:
    """Hands out the turns of each room, in the order they are asked for."""

    def __init__(self) -> None:
        self._last: dict[RoomKey, asyncio.Future[None]] = {}

    def take(self, room: RoomKey) -> Turn:
        """The next turn of ``room`` (call before the accept's first wait)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turn = Turn(self._last.get(room), done)
        self._last[room] = done
        done.add_done_callback(lambda _: self._forget(room, done))
        return turn

    def _forget(self, room: RoomKey, done: asyncio.Future[None]) -> None:
        if self._last.get(room) is done:
            del self._last[room]

    @property
    def rooms(self) -> int:
        """Rooms with a turn under way (a gauge for tests: idle rooms cost nothing)."""
        return len(self._last)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)

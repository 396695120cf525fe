"""The global pool of run slots, granted in first-come order. Pure.

A holder waiting for a person lends its slot (:meth:`SlotPool.lend`) and takes one
back (:meth:`SlotPool.reclaim`) before it goes on: reclaimers are served first-come,
ahead of every conversation waiting to start (docs/live-runs.md, "Waiting runs and
the run slots").
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

from bridge.core.model import RoomKey


def _no_room_cap(room: RoomKey) -> int | None:
    return None


class SlotPool:
    """At most ``capacity`` conversations hold a slot; the others wait in FIFO order.

    ``room_cap`` bounds the slots one room's conversations (its threads, see
    :attr:`RoomKey.channel`) hold at once (None: no bound): a conversation
    whose room is at its bound is passed over, keeping its place, for the
    next one waiting.

    Every operation returns the conversations granted a slot by it, in grant
    order. After every operation, a free slot implies that every waiting
    conversation's room is at its bound. Holders may outnumber the capacity
    (:meth:`take`, :meth:`resize`): then nothing is granted until enough slots
    are released.

    A lent slot is free for others; its conversation still counts for its
    room's bound (its run goes on, waiting). Reclaimers get free slots before
    any waiting conversation, oldest first.
    """

    __slots__ = (
        "_capacity",
        "_holders",
        "_lent",
        "_per_room",
        "_reclaiming",
        "_room_cap",
        "_waiting",
    )

    def __init__(
        self, capacity: int, room_cap: Callable[[RoomKey], int | None] = _no_room_cap
    ) -> None:
        if capacity < 0:
            raise ValueError("capacity must not be negative")
        self._capacity = capacity
        self._room_cap = room_cap
        self._holders: set[RoomKey] = set()
        self._per_room: Counter[RoomKey] = Counter()
        """Holders per room (channel)."""
        # A dict is an insertion-ordered set with O(1) removal (withdraw).
        self._waiting: dict[RoomKey, None] = {}
        self._lent: set[RoomKey] = set()
        """Holders that lent their slot (reclaimers among them)."""
        self._reclaiming: dict[RoomKey, None] = {}
        """Lent conversations waiting for a slot back, oldest first."""

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def in_use(self) -> int:
        return len(self._holders)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def lent(self) -> int:
        """Conversations that lent their slot (reclaimers included)."""
        return len(self._lent)

    @property
    def reclaiming(self) -> list[RoomKey]:
        """The reclaimers, oldest first."""
        return list(self._reclaiming)

    def lends(self, room: RoomKey) -> bool:
        """``room`` lent its slot and does not hold one again yet."""
        return room in self._lent

    def ahead(self, room: RoomKey) -> int:
        """Reclaimers ahead of ``room`` (0 if it does not reclaim)."""
        for i, key in enumerate(self._reclaiming):
            if key == room:
                return i
        return 0

    @property
    def short(self) -> bool:
        """Some conversation waits for want of a slot (not only for its room's cap)."""
        if self._reclaiming:
            return True
        if len(self._holders) < self._capacity:
            return False  # a free slot: everyone waiting is at their room's cap
        return any(self.short_for(room) for room in self._waiting)

    def short_for(self, room: RoomKey) -> bool:
        """``room`` waits, and a free slot would be granted to it (its room has room)."""
        return room in self._waiting and not self._room_full(room)

    def holds(self, room: RoomKey) -> bool:
        return room in self._holders

    def is_waiting(self, room: RoomKey) -> bool:
        return room in self._waiting

    def request(self, room: RoomKey) -> list[RoomKey]:
        """Queue ``room`` for a slot (it may be granted at once)."""
        if room in self._holders or room in self._waiting or room in self._lent:
            raise RuntimeError(f"room {room} already holds or waits for a slot")
        self._waiting[room] = None
        return self._grant()

    def take(self, room: RoomKey) -> None:
        """``room`` holds a slot at once, beyond the capacity if need be.

        For a run that is already going (adopted after a restart): it cannot
        wait for a slot, so the others wait until holders are below capacity.
        """
        if room in self._holders or room in self._waiting or room in self._lent:
            raise RuntimeError(f"room {room} already holds or waits for a slot")
        self._hold(room)

    def lend(self, room: RoomKey) -> list[RoomKey]:
        """``room`` (a holder) lends its slot: the first in line gets it."""
        if room not in self._holders:
            raise RuntimeError(f"room {room} holds no slot to lend")
        self._holders.remove(room)
        self._lent.add(room)
        return self._grant()

    def reclaim(self, room: RoomKey) -> list[RoomKey]:
        """``room`` (a lender) wants a slot back: at once if one is free and no
        reclaimer is ahead, else when one frees (before any waiting conversation)."""
        if room not in self._lent or room in self._reclaiming:
            raise RuntimeError(f"room {room} has no lent slot to reclaim")
        self._reclaiming[room] = None
        return self._grant()

    def reclaim_now(self, room: RoomKey) -> None:
        """``room`` (a lender, reclaiming or not) holds a slot again at once, beyond
        the capacity if need be (shutdown: no new run begins, the going ones finish)."""
        if room not in self._lent:
            raise RuntimeError(f"room {room} has no lent slot to reclaim")
        self._lent.remove(room)
        self._reclaiming.pop(room, None)
        self._holders.add(room)

    def release(self, room: RoomKey) -> list[RoomKey]:
        """``room`` gives its slot back (or, having lent it, its claim on one); the
        longest waiting room gets what is free."""
        if room in self._lent:
            self._lent.remove(room)
            self._reclaiming.pop(room, None)
        else:
            try:
                self._holders.remove(room)
            except KeyError:
                raise RuntimeError(f"room {room} holds no slot") from None
        self._per_room[room.channel] -= 1
        if not self._per_room[room.channel]:
            del self._per_room[room.channel]
        return self._grant()

    def withdraw(self, room: RoomKey) -> None:
        """``room`` gives up its place in the queue."""
        self._waiting.pop(room, None)

    def resize(self, capacity: int) -> list[RoomKey]:
        """Change the capacity. Shrinking below ``in_use`` revokes nothing: it stops grants."""
        if capacity < 0:
            raise ValueError("capacity must not be negative")
        self._capacity = capacity
        return self._grant()

    def _hold(self, room: RoomKey) -> None:
        self._holders.add(room)
        self._per_room[room.channel] += 1

    def _room_full(self, room: RoomKey) -> bool:
        cap = self._room_cap(room.channel)
        return cap is not None and self._per_room[room.channel] >= cap

    def _grant(self) -> list[RoomKey]:
        # Runs already going first: one that waited for a person is not starved by new ones.
        free = self._capacity - len(self._holders)
        reclaimed = list(itertools.islice(self._reclaiming, max(free, 0)))
        for room in reclaimed:
            del self._reclaiming[room]
            self._lent.remove(room)
            self._holders.add(room)  # its room's count never dropped
        if self._reclaiming:
            return reclaimed
        return reclaimed + self._grant_waiting()

    def _grant_waiting(self) -> list[RoomKey]:
        granted: list[RoomKey] = []
        free = self._capacity - len(self._holders)
        # Oldest first, as far as the free slots go: a long queue costs only the
        # conversations passed over (their rooms at their caps).
        for room in self._waiting:
            if len(granted) >= free:
                break
            if not self._room_full(room):
                self._hold(room)  # counts for the room's cap from now on
                granted.append(room)
        for room in granted:
            del self._waiting[room]
        if not self._waiting:
            self._waiting = {}  # drop the table a long queue left behind (dicts never shrink)
        return granted

"""The global pool of run slots, granted in first-come order. Pure."""

from __future__ import annotations

from bridge.core.model import RoomKey


class SlotPool:
    """At most ``capacity`` rooms hold a slot; the others wait in FIFO order.

    Every operation returns the rooms granted a slot by it, in grant order.
    After every operation, a free slot implies that no room waits. Holders may
    outnumber the capacity (:meth:`take`, :meth:`resize`): then nothing is
    granted until enough slots are released.
    """

    __slots__ = ("_capacity", "_holders", "_waiting")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must not be negative")
        self._capacity = capacity
        self._holders: set[RoomKey] = set()
        # A dict is an insertion-ordered set with O(1) removal (withdraw).
        self._waiting: dict[RoomKey, None] = {}

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def in_use(self) -> int:
        return len(self._holders)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def holds(self, room: RoomKey) -> bool:
        return room in self._holders

    def is_waiting(self, room: RoomKey) -> bool:
        return room in self._waiting

    def request(self, room: RoomKey) -> list[RoomKey]:
        """Queue ``room`` for a slot (it may be granted at once)."""
        if room in self._holders or room in self._waiting:
            raise RuntimeError(f"room {room} already holds or waits for a slot")
        self._waiting[room] = None
        return self._grant()

    def take(self, room: RoomKey) -> None:
        """``room`` holds a slot at once, beyond the capacity if need be.

        For a run that is already going (adopted after a restart): it cannot
        wait for a slot, so the others wait until holders are below capacity.
        """
        if room in self._holders or room in self._waiting:
            raise RuntimeError(f"room {room} already holds or waits for a slot")
        self._holders.add(room)

    def release(self, room: RoomKey) -> list[RoomKey]:
        """``room`` gives its slot back; the longest waiting room gets it."""
        try:
            self._holders.remove(room)
        except KeyError:
            raise RuntimeError(f"room {room} holds no slot") from None
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

    def _grant(self) -> list[RoomKey]:
        granted: list[RoomKey] = []
        while self._waiting and len(self._holders) < self._capacity:
            room = next(iter(self._waiting))
            del self._waiting[room]
            self._holders.add(room)
            granted.append(room)
        if not self._waiting:
            self._waiting = {}  # drop the table a long queue left behind (dicts never shrink)
        return granted

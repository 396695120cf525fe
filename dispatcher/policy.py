"""What the dispatcher does while a room's run goes, and the hook for prestarting runs."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from bridge.core.model import RoomKey


class DuringRun(StrEnum):
    """What happens to a room's messages that arrive while its run goes (per room)."""

    QUEUE = "queue"
    """They wait and go into the next run, once this one has ended."""
    STEER = "steer"
    """They are debounced into steer batches handed to the running run, which
    takes them at its next step (or refuses: then they queue)."""
    INTERRUPT = "interrupt"
    """As ``steer``, and the run is asked to interrupt its current turn for them."""


class PrestartCancel(StrEnum):
    """Why a prestart is cancelled (the ``why`` of :meth:`Prestarter.cancel`)."""

    DROPPED = "dropped"
    """The room's batch was dropped (``!stop``) before its run began."""
    SHUTDOWN = "shutdown"
    """The dispatcher drains: no run begins any more."""
    SLOT_NEEDED = "slot needed"
    """A room waits for a run slot: the process budget is the runs' now."""
    IDLE = "idle"
    """The room has nothing left to run (its messages were deleted)."""
    ADOPTED = "adopted"
    """A run already going (reattached) became the room's run instead."""


class Prestarter(Protocol):
    """Starts a run's process ahead of its prompt; the bridge implements it.

    Called synchronously from the dispatcher's event handling: both calls
    must return at once (start or stop the work in a task). An exception is
    logged and otherwise ignored. Each ``begin`` is followed by exactly one
    ``cancel`` of that room, or by the room's run beginning with
    ``DispatchedRun.prestarted`` set (then ``execute`` takes the prestart).
    """

    def begin(self, room: RoomKey) -> None: ...

    def cancel(self, room: RoomKey, why: str) -> None: ...

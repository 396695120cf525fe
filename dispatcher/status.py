"""What the dispatcher reports about a room."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from bridge.core.model import Batch, Message, RoomKey


class EndReason(StrEnum):
    """Why the dispatcher cancelled a run that had begun."""

    STOPPED = "stopped"
    """The room asked (``!stop``): its messages are not run again."""
    INTERRUPTED = "interrupted"
    """Shutdown cut it off: ``!retry`` may run it again."""
    DETACHED = "detached"
    """Shutdown left it to its supervisor: it goes on without this process, and a
    restarted bridge reattaches to it. Its ``execute`` records no end."""

    @property
    def by_shutdown(self) -> bool:
        """A reason a shutdown cancels runs for; a stop that comes later overrides it."""
        return self is not EndReason.STOPPED


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """The room's run, which lent its slot, holds one again: it may go on."""

    room: RoomKey


@dataclass(frozen=True, slots=True)
class StopResult:
    """What :meth:`Dispatcher.stop` did to a room."""

    stopped: Batch | None
    """The begun run that was cancelled, or None if none was running (or it was
    already stopping). A run granted but not begun is not cancelled: its
    messages are in ``dropped``."""
    dropped: tuple[Message, ...]
    """Messages that were waiting for a run and will never get one, in arrival order."""


@dataclass(frozen=True, slots=True)
class RoomStatus:
    """A snapshot of one room, for ``!status`` and metrics."""

    running: Batch | None = None
    """The batch of the room's active run, if any."""
    running_since: float | None = None
    """Clock time the active run started."""
    waiting: int = 0
    """Messages accepted but not yet in a run (open batch, queue, and those
    gathering or offered to steer the active run)."""
    waiting_for_slot: bool = False
    """The room is ready to run and waits for a free run slot."""
    stopping: bool = False
    """The active run was stopped and is winding down."""
    steering: int = 0
    """Of ``waiting``: messages gathering into a steer batch or offered to the active run."""
    steered: int = 0
    """Messages the active run took by steering, besides its batch (not in ``running``)."""
    lent: bool = False
    """The active run lent its run slot while it waits for a person (reclaiming included)."""
    reclaiming: int | None = None
    """The active run waits for its slot back: how many runs are ahead of it."""


IDLE = RoomStatus()
"""The status of a room with nothing to do."""

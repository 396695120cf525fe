"""One room's dispatch rules, as a pure state machine.

A :class:`Room` gets events with an explicit ``now`` and answers with
effects for its owner to carry out; it never reads a clock, sleeps or
schedules anything, so every rule can be tested (and property-tested) with
exact times.

A room is in one of four phases:

- idle: nothing pending, no run. The owner drops the record.
- gathering: an open batch waits for its window to close (timer armed).
- ready: the batch is due and the room waits for a run slot; it keeps
  gathering messages meanwhile.
- running: a run is active; new messages queue behind it. When it ends,
  queued messages are ready at once (no new debounce).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from bridge.core.model import Batch, Message, RoomKey
from dispatcher.limits import DispatchLimits


@dataclass(frozen=True, slots=True)
class ArmTimer:
    """Call :meth:`Room.tick` at ``at`` (earlier calls are ignored, later ones are fine)."""

    at: float


@dataclass(frozen=True, slots=True)
class RequestSlot:
    """The room is ready: queue it for a run slot; answer with :meth:`Room.slot_granted`."""


@dataclass(frozen=True, slots=True)
class WithdrawSlotRequest:
    """The room no longer wants the slot it asked for (it was stopped)."""


@dataclass(frozen=True, slots=True)
class StartRun:
    """Start a run of ``batch``; report its end with :meth:`Room.run_finished`."""

    batch: Batch


@dataclass(frozen=True, slots=True)
class ReleaseSlot:
    """The room's run ended: its slot is free."""


@dataclass(frozen=True, slots=True)
class CancelRun:
    """Cancel the active run of ``batch``; it still reports its end when it has wound down."""

    batch: Batch


@dataclass(frozen=True, slots=True)
class Dropped:
    """These messages will never run (stopped), in arrival order."""

    messages: tuple[Message, ...]


Effect = ArmTimer | RequestSlot | WithdrawSlotRequest | StartRun | ReleaseSlot | CancelRun | Dropped

# The effects without fields are shared: a busy room allocates none per event.
REQUEST_SLOT = RequestSlot()
WITHDRAW_SLOT_REQUEST = WithdrawSlotRequest()
RELEASE_SLOT = ReleaseSlot()


class Phase(StrEnum):
    IDLE = "idle"
    GATHERING = "gathering"
    READY = "ready"
    RUNNING = "running"


class Room:
    """The dispatch state of one room with work; see the module docstring."""

    __slots__ = (
        "_first_at",
        "_last_at",
        "_limits",
        "_pending",
        "_ready",
        "_run",
        "_run_since",
        "_stopping",
        "_timer_at",
        "key",
    )

    def __init__(self, key: RoomKey, limits: DispatchLimits) -> None:
        self.key = key
        self._limits = limits
        self._pending: list[Message] = []
        """Messages not yet in a run, in arrival order."""
        self._first_at = 0.0
        """Arrival of the open batch's first message (gathering only)."""
        self._last_at = 0.0
        """Arrival of the open batch's last message (gathering only)."""
        self._timer_at: float | None = None
        """The tick asked for; earlier ticks are stale (gathering only)."""
        self._ready = False
        self._run: Batch | None = None
        self._run_since: float | None = None
        self._stopping = False

    # -- queries -------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        if self._run is not None:
            return Phase.RUNNING
        if self._ready:
            return Phase.READY
        if self._pending:
            return Phase.GATHERING
        return Phase.IDLE

    @property
    def idle(self) -> bool:
        """Nothing pending and no run: the owner may forget this room."""
        return self._run is None and not self._pending

    @property
    def pending(self) -> int:
        """Messages not yet in a run."""
        return len(self._pending)

    @property
    def run(self) -> Batch | None:
        return self._run

    @property
    def run_since(self) -> float | None:
        return self._run_since

    @property
    def ready(self) -> bool:
        """Waiting for a run slot."""
        return self._ready

    @property
    def stopping(self) -> bool:
        """The active run was cancelled and has not reported its end yet."""
        return self._stopping

    @property
    def deadline(self) -> float | None:
        """When the open batch is due (gathering only)."""
        return self._deadline() if self.phase is Phase.GATHERING else None

    # -- events --------------------------------------------------------------

    def message(self, message: Message, now: float) -> list[Effect]:
        """A message for this room arrived at ``now``."""
        self._pending.append(message)
        if self._run is not None or self._ready:
            return []  # queued behind the run, or gathered while waiting for a slot
        if len(self._pending) == 1:
            self._first_at = now
        self._last_at = now
        if len(self._pending) >= self._limits.max_batch or now >= self._deadline():
            return self._become_ready()  # full, or a zero window
        if self._timer_at is None:
            # The window only ever moves later, so one timer per open batch is
            # enough: an early tick re-arms for the moved deadline.
            self._timer_at = self._deadline()
            return [ArmTimer(self._timer_at)]
        return []

    def tick(self, now: float) -> list[Effect]:
        """A timer this room armed fired (or a stale one: that is ignored)."""
        if self._timer_at is None or now < self._timer_at:
            return []
        deadline = self._deadline()
        if now >= deadline:
            return self._become_ready()
        self._timer_at = deadline
        return [ArmTimer(deadline)]

    def slot_granted(self, now: float) -> list[Effect]:
        """The room got the run slot it asked for: the first ``max_batch`` messages run."""
        if not self._ready:
            raise RuntimeError(f"room {self.key} got a slot it did not ask for")
        self._ready = False
        size = self._limits.max_batch
        self._run = Batch(self.key, tuple(self._pending[:size]))
        del self._pending[:size]
        self._run_since = now
        self._stopping = False
        return [StartRun(self._run)]

    def run_finished(self, now: float) -> list[Effect]:
        """The active run ended (whatever the outcome); queued messages are ready at once."""
        if self._run is None:
            raise RuntimeError(f"room {self.key} has no run to finish")
        self._run = None
        self._run_since = None
        self._stopping = False
        if not self._pending:
            return [RELEASE_SLOT]
        # Releasing first lets a room that has waited longer take the slot (FIFO).
        self._ready = True
        return [RELEASE_SLOT, REQUEST_SLOT]

    def stop(self) -> list[Effect]:
        """Cancel the active run (once) and drop every message not yet in a run."""
        effects: list[Effect] = []
        if self._run is not None and not self._stopping:
            self._stopping = True
            effects.append(CancelRun(self._run))
        if self._ready:
            self._ready = False
            effects.append(WITHDRAW_SLOT_REQUEST)
        if self._pending:
            effects.append(Dropped(tuple(self._pending)))
            self._pending = []
        self._timer_at = None
        return effects

    # -- internals -----------------------------------------------------------

    def _deadline(self) -> float:
        return min(
            self._last_at + self._limits.coalesce_s, self._first_at + self._limits.max_wait_s
        )

    def _become_ready(self) -> list[Effect]:
        self._ready = True
        self._timer_at = None
        return [REQUEST_SLOT]

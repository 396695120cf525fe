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
- running: a run was granted (or adopted); new messages queue behind it.
  When it ends, queued messages are ready at once (no new debounce).

A granted run has *begun* once its owner is about to carry it out
(:meth:`Room.begin`). Until then nothing has happened outside: a stop drops
its messages with the rest, and a drain (shutdown) puts them back in front
of the queue, so they stay pending and run after a restart. A begun run is
cancelled with a reason (:class:`~dispatcher.status.EndReason`): stopped by
the room, or interrupted or detached by shutdown (the drain says which); a
stop that comes while a run cut off by shutdown winds down makes it stopped
(the user's word wins).

A run that is already going (an earlier process started it and a restarted
one reattached to it) is *adopted* (:meth:`Room.adopt`): it becomes the
room's run, begun from the start, and takes a run slot even beyond the cap,
since it cannot wait for one. From then on it is a run like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from bridge.core.model import Batch, Message, RoomKey
from dispatcher.limits import DispatchLimits
from dispatcher.status import EndReason


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
class TakeSlot:
    """An adopted run holds a slot from now on, even beyond the cap."""


@dataclass(frozen=True, slots=True)
class ReleaseSlot:
    """The room's run ended: its slot is free."""


@dataclass(frozen=True, slots=True)
class CancelRun:
    """Cancel the begun run of ``batch``; it still reports its end when it has wound down."""

    batch: Batch
    reason: EndReason


@dataclass(frozen=True, slots=True)
class Restated:
    """The run of ``batch``, already cancelled, now ends for ``reason`` (no new cancel)."""

    batch: Batch
    reason: EndReason


@dataclass(frozen=True, slots=True)
class SkipRun:
    """The granted run of ``batch`` must never begin; it still reports its end.

    ``dropped``: its messages were dropped (a stop); otherwise they went back
    to the front of the queue (a drain).
    """

    batch: Batch
    dropped: bool


@dataclass(frozen=True, slots=True)
class Dropped:
    """These messages will never run (stopped), in arrival order."""

    messages: tuple[Message, ...]


Effect = (
    ArmTimer
    | RequestSlot
    | WithdrawSlotRequest
    | StartRun
    | TakeSlot
    | ReleaseSlot
    | CancelRun
    | Restated
    | SkipRun
    | Dropped
)

# The effects without fields are shared: a busy room allocates none per event.
REQUEST_SLOT = RequestSlot()
WITHDRAW_SLOT_REQUEST = WithdrawSlotRequest()
TAKE_SLOT = TakeSlot()
RELEASE_SLOT = ReleaseSlot()


class Phase(StrEnum):
    IDLE = "idle"
    GATHERING = "gathering"
    READY = "ready"
    RUNNING = "running"


class Room:
    """The dispatch state of one room with work; see the module docstring."""

    __slots__ = (
        "_began",
        "_cancel",
        "_first_at",
        "_last_at",
        "_limits",
        "_pending",
        "_ready",
        "_run",
        "_run_since",
        "_skipped",
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
        self._began = False
        """The run was carried out (its owner called :meth:`begin` and got True)."""
        self._skipped = False
        """The run was granted but must never begin (stopped or drained first)."""
        self._cancel: EndReason | None = None
        """Why the run is ending early, once it was cancelled or skipped by a stop."""

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
        """The batch of the granted run (also one that will never begin), if any."""
        return self._run

    @property
    def began(self) -> bool:
        return self._began

    @property
    def run_since(self) -> float | None:
        return self._run_since

    @property
    def ready(self) -> bool:
        """Waiting for a run slot."""
        return self._ready

    @property
    def stopping(self) -> bool:
        """The run was cancelled (or skipped by a stop) and has not reported its end yet."""
        return self._cancel is not None

    @property
    def cancel_reason(self) -> EndReason | None:
        return self._cancel

    @property
    def deadline(self) -> float | None:
        """When the open batch is due (gathering only)."""
        return self._deadline() if self.phase is Phase.GATHERING else None

    # -- events --------------------------------------------------------------

    def message(self, message: Message, now: float) -> list[Effect]:
        """A message for this room arrived at ``now``."""
        self._pending.append(message)
        return self._arrived(len(self._pending) == 1, now)

    def restore(self, messages: tuple[Message, ...], now: float) -> list[Effect]:
        """Put back, in front of the queue, messages a stop took out (undoing the drop).

        They are older than anything that arrived since, so order is kept.
        """
        if not messages:
            return []
        opens = not self._pending
        self._pending[:0] = messages
        return self._arrived(opens, now)

    def replace(self, message: Message) -> bool:
        """An edit: the pending message with ``message.id`` now reads as ``message``.

        False (nothing changes) if it is not pending: it went into a run, or
        was dropped, or never came.
        """
        for index, queued in enumerate(self._pending):
            if queued.id == message.id:
                self._pending[index] = message
                return True
        return False

    def remove(self, message: Message) -> tuple[bool, list[Effect]]:
        """A deletion: the pending message with ``message.id`` never runs.

        False if it is not pending. A room left with nothing gives up its
        slot request and goes idle; the window of the rest is not moved.
        """
        for index, queued in enumerate(self._pending):
            if queued.id == message.id:
                del self._pending[index]
                break
        else:
            return False, []
        effects: list[Effect] = []
        if not self._pending and self._run is None:
            if self._ready:
                self._ready = False
                effects.append(WITHDRAW_SLOT_REQUEST)
            self._timer_at = None
        return True, effects

    def _arrived(self, opens: bool, now: float) -> list[Effect]:
        if self._run is not None or self._ready:
            return []  # queued behind the run, or gathered while waiting for a slot
        if opens:
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
        self._began = False
        self._skipped = False
        self._cancel = None
        return [StartRun(self._run)]

    def adopt(self, batch: Batch, now: float) -> list[Effect]:
        """A run already going (reattached after a restart) becomes this room's run.

        It has begun. Messages not yet in a run queue behind it, as behind any
        run: an open batch's window no longer matters and a slot request is
        given up. Raises ValueError if the room has a run (granted or begun).
        """
        if batch.room != self.key:
            raise ValueError(f"a batch of room {batch.room} adopted by room {self.key}")
        if self._run is not None:
            raise ValueError(f"room {self.key} already has a run")
        effects: list[Effect] = []
        if self._ready:
            self._ready = False
            effects.append(WITHDRAW_SLOT_REQUEST)
        self._timer_at = None
        self._run = batch
        self._run_since = now
        self._began = True
        self._skipped = False
        self._cancel = None
        effects.append(TAKE_SLOT)
        return effects

    def begin(self) -> bool:
        """The owner is about to carry out the granted run: True if it may.

        False for a run stopped or drained since it was granted: it never
        begins, and the owner reports its end at once.
        """
        if self._run is None:
            raise RuntimeError(f"room {self.key} has no run to begin")
        if self._skipped:
            return False
        self._began = True
        return True

    def run_finished(self, now: float) -> list[Effect]:
        """The active run ended (whatever the outcome); queued messages are ready at once."""
        if self._run is None:
            raise RuntimeError(f"room {self.key} has no run to finish")
        self._run = None
        self._run_since = None
        self._began = False
        self._skipped = False
        self._cancel = None
        if not self._pending:
            return [RELEASE_SLOT]
        # Releasing first lets a room that has waited longer take the slot (FIFO).
        self._ready = True
        return [RELEASE_SLOT, REQUEST_SLOT]

    def stop(self) -> list[Effect]:
        """Cancel the begun run (once) and drop every message not yet in a run.

        A granted run that has not begun is skipped: its messages are dropped
        first, in order, before the queued ones.
        """
        effects: list[Effect] = []
        dropped: list[Message] = []
        if self._run is not None and self._cancel is not None and self._cancel.by_shutdown:
            # Already being cancelled by the shutdown, and then the room said
            # stop: the user's word wins. The run is recorded stopped and not
            # offered for ``!retry`` (an interrupted one would be), nor left
            # to its supervisor (a detached one would be). No second
            # cancellation: the owner reads the reason when the run has wound down.
            self._cancel = EndReason.STOPPED
            effects.append(Restated(self._run, EndReason.STOPPED))
        if self._run is not None and self._cancel is None:
            self._cancel = EndReason.STOPPED
            if self._began:
                effects.append(CancelRun(self._run, EndReason.STOPPED))
            elif not self._skipped:
                self._skipped = True
                dropped += self._run.messages
                effects.append(SkipRun(self._run, dropped=True))
        if self._ready:
            self._ready = False
            effects.append(WITHDRAW_SLOT_REQUEST)
        dropped += self._pending
        if dropped:
            effects.append(Dropped(tuple(dropped)))
        self._pending = []
        self._timer_at = None
        return effects

    def drain(self) -> list[Effect]:
        """Shutdown: a granted run that has not begun never will; its messages queue again."""
        if self._run is None or self._began or self._skipped:
            return []
        self._skipped = True
        self._pending[:0] = self._run.messages
        return [SkipRun(self._run, dropped=False)]

    def interrupt(self, reason: EndReason = EndReason.INTERRUPTED) -> list[Effect]:
        """Shutdown cut-off: cancel the begun run for ``reason`` unless it is already ending.

        ``reason`` is INTERRUPTED or DETACHED (the run is left to its supervisor).
        """
        if not reason.by_shutdown:
            raise ValueError(f"a shutdown does not cancel a run as {reason}")
        if self._run is None or not self._began or self._cancel is not None:
            return []
        self._cancel = reason
        return [CancelRun(self._run, reason)]

    # -- internals -----------------------------------------------------------

    def _deadline(self) -> float:
        return min(
            self._last_at + self._limits.coalesce_s, self._first_at + self._limits.max_wait_s
        )

    def _become_ready(self) -> list[Effect]:
        self._ready = True
        self._timer_at = None
        return [REQUEST_SLOT]

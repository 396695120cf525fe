"""One room's dispatch rules, as a pure state machine.

A :class:`Room` gets events with an explicit ``now`` and answers with effects for its
owner to carry out; it never reads a clock, sleeps or schedules anything. Its phases
(idle, gathering, ready, running), batches that never mix threads, begun and adopted
runs, steering and windows that follow typing: docs/live-runs.md, "One room's rules"
and "Dispatcher (`dispatcher/`)".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from bridge.core.model import Batch, Message, MessageId, RoomKey, UserId
from dispatcher.limits import DispatchLimits
from dispatcher.policy import DuringRun
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
    """Start a run of ``batch``; report its end with :meth:`Room.run_finished`.

    ``prestarted``: a prestart was begun for the room and goes with this run
    (set by the scheduler; the room knows nothing of prestarts).
    """

    batch: Batch
    prestarted: bool = False


@dataclass(frozen=True, slots=True)
class SteerRun:
    """Hand ``batch`` to the room's running run; answer with :meth:`Room.steer_answered`.

    ``interrupt``: the run should interrupt its current turn for it.
    """

    batch: Batch
    interrupt: bool


@dataclass(frozen=True, slots=True)
class BeginPrestart:
    """Start a run's process for ``room`` ahead of its prompt (a scheduler decision)."""

    room: RoomKey


@dataclass(frozen=True, slots=True)
class CancelPrestart:
    """Cancel the prestart of ``room``, for ``why`` (a scheduler decision)."""

    room: RoomKey
    why: str


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
    | SteerRun
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
        "_idle_s",
        "_interrupt",
        "_last_at",
        "_limits",
        "_offered",
        "_pending",
        "_ready",
        "_run",
        "_run_since",
        "_skipped",
        "_steer",
        "_steer_due",
        "_steered",
        "_timer_at",
        "_typing",
        "key",
    )

    def __init__(
        self,
        key: RoomKey,
        limits: DispatchLimits,
        *,
        idle_s: float | None = None,
        typing: frozenset[UserId] = frozenset(),
    ) -> None:
        """``idle_s``: the room follows typing (see the module docstring); ``typing``:
        who types in it now."""
        if idle_s is not None and idle_s < 0:
            raise ValueError("idle_s must not be negative")
        self.key = key
        self._limits = limits
        self._idle_s = idle_s
        self._typing = typing
        """Who types in the room now (only read when following typing)."""
        self._pending: list[Message] = []
        """Messages not yet in a run, in arrival order."""
        self._steer: list[Message] = []
        """Messages gathering into the next steer batch, in arrival order (running only)."""
        self._offered: Batch | None = None
        """The steer batch handed to the run, awaiting its answer."""
        self._steer_due = False
        """The gathering steer batch is due; it is offered once the offer out is answered."""
        self._interrupt = False
        """The last steer message came in ``interrupt`` mode."""
        self._steered = 0
        """Messages the current run took by steering."""
        # The window fields serve the open batch while gathering and the steer
        # batch while running: a room never has both.
        self._first_at = 0.0
        """Arrival of the open (or steer) batch's first message."""
        self._last_at = 0.0
        """Arrival of the open (or steer) batch's last message, or (following typing)
        when the last of its senders stopped typing, if later."""
        self._timer_at: float | None = None
        """The tick asked for; earlier ticks are stale."""
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
        """Messages not yet in a run: queued, or gathering or offered for steering."""
        return len(self._pending) + self.steering

    @property
    def steering(self) -> int:
        """Messages gathering into a steer batch or offered to the run, not taken yet."""
        return len(self._steer) + (0 if self._offered is None else len(self._offered.messages))

    @property
    def steered(self) -> int:
        """Messages the current run took by steering (besides its batch)."""
        return self._steered

    @property
    def offered(self) -> Batch | None:
        """The steer batch handed to the run and not answered yet."""
        return self._offered

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

    def message(
        self,
        message: Message,
        now: float,
        mode: DuringRun = DuringRun.QUEUE,
        arrived: float | None = None,
    ) -> list[Effect]:
        """A message for this room is handed over at ``now``; ``mode`` is the room's
        during-run mode. It ``arrived`` earlier (recording it took that long): its
        window counts from then, but never moves a batch's window back."""
        at = now if arrived is None else min(arrived, now)
        if mode is not DuringRun.QUEUE and self._steers(message):
            return self._steer_arrived(message, now, at, interrupt=mode is DuringRun.INTERRUPT)
        self._pending.append(message)
        return self._arrived(len(self._pending) == 1, now, at)

    def restore(self, messages: tuple[Message, ...], now: float) -> list[Effect]:
        """Put back, in front of the queue, messages a stop took out (undoing the drop).

        They are older than anything that arrived since, so order is kept.
        """
        if not messages:
            return []
        self._unsteer()  # what gathers to steer is newer: it queues behind them
        opens = not self._pending
        self._pending[:0] = messages
        return self._arrived(opens, now)

    def holds(self, message: MessageId) -> bool:
        """``message`` waits here, is offered to steer, or is in the room's run."""
        batches = [b for b in (self._run, self._offered) if b is not None]
        return any(m.id == message for m in (*self._steer, *self._pending)) or any(
            message in b.ids for b in batches
        )

    def replace(self, message: Message) -> bool:
        """An edit: the pending message with ``message.id`` now reads as ``message``.

        False (nothing changes) if it is not pending: it went into a run, or
        was dropped, or never came.
        """
        for waiting in (self._steer, self._pending):  # oldest first, as remove()
            for index, queued in enumerate(waiting):
                if queued.id == message.id:
                    waiting[index] = message
                    return True
        return False

    def remove(self, message: Message, now: float) -> tuple[bool, list[Effect]]:
        """A deletion at ``now``: the pending message with ``message.id`` never runs.

        False if it is not pending. A room left with nothing gives up its
        slot request and goes idle; the window of the rest is not moved,
        unless (following typing) it was held open only for the deleted
        message's typing sender: then the rest is quiet from ``now`` on.
        """
        was = self._sender_typing()
        for index, queued in enumerate(self._steer):
            if queued.id == message.id:
                del self._steer[index]
                if not self._steer:
                    self._timer_at = None
                    self._steer_due = False
                return True, self._senders_changed(was, now)
        for index, queued in enumerate(self._pending):
            if queued.id == message.id:
                del self._pending[index]
                break
        else:
            return False, []
        if not self._pending and self._run is None:
            self._timer_at = None
            if self._ready:
                self._ready = False
                return True, [WITHDRAW_SLOT_REQUEST]
            return True, []
        return True, self._senders_changed(was, now)

    def _arrived(self, opens: bool, now: float, at: float | None = None) -> list[Effect]:
        if self._run is not None or self._ready:
            return []  # queued behind the run, or gathered while waiting for a slot
        self._window_from(opens, now if at is None else at)
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
            return self._steer_ready() if self._run is not None else self._become_ready()
        self._timer_at = deadline
        return [ArmTimer(deadline)]

    def typing(self, users: frozenset[UserId], now: float) -> list[Effect]:
        """``users`` type in the room from ``now`` on (all of them: the others stopped).

        Only a room following typing listens, and only while a window is open.
        When the last sender of the open batch's messages stops, its window
        closes ``idle_s`` later (at once if that has passed); while one types,
        it stays open up to max wait.
        """
        if self._idle_s is None:
            return []
        was = self._sender_typing()
        self._typing = users
        return self._senders_changed(was, now)

    def _senders_changed(self, was: bool, now: float) -> list[Effect]:
        """Who types, or whose messages wait, changed at ``now`` (``was``: a sender of
        the open batch typed before): following typing, its window may close earlier."""
        if self._idle_s is None or self._timer_at is None:
            return []  # no window open: the batch is due, queued, or there is none
        if was and not self._sender_typing():
            self._last_at = max(self._last_at, now)
        deadline = self._deadline()
        if now >= deadline:
            return self._steer_ready() if self._run is not None else self._become_ready()
        if deadline < self._timer_at:
            # The window moved earlier: the armed tick would come late.
            self._timer_at = deadline
            return [ArmTimer(deadline)]
        return []

    def steer_answered(self, batch: Batch, taken: bool) -> tuple[bool, list[Effect]]:
        """The run answered the offer of ``batch``: ``taken`` into it, or refused.

        False (nothing changes) if ``batch`` is not the room's offer any more
        (the run ended or the room was stopped since). A refused batch
        becomes the queue's head; a taken one lets the next steer batch be
        offered if it is due.
        """
        if self._offered is not batch:
            return False, []
        self._offered = None
        if taken:
            self._steered += len(batch.messages)
            return True, self._offer() if self._steer_due else []
        # The run takes no more input: everything not taken is its follow-up,
        # oldest first, exactly as it would have queued in ``queue`` mode.
        self._unsteer()
        self._pending[:0] = batch.messages
        return True, []

    def slot_granted(self, now: float) -> list[Effect]:
        """The room got the run slot it asked for: the first ``max_batch`` messages run."""
        if not self._ready:
            raise RuntimeError(f"room {self.key} got a slot it did not ask for")
        self._ready = False
        size = _one_thread(self._pending, self._limits.max_batch)
        self._run = Batch(self.key, tuple(self._pending[:size]))
        del self._pending[:size]
        self._run_since = now
        self._began = False
        self._skipped = False
        self._cancel = None
        self._steered = 0
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
        self._steered = 0
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
        # Steer messages not taken are the head of the queue, the offer out first.
        self._unsteer()
        self._unoffer()
        self._run = None
        self._run_since = None
        self._began = False
        self._skipped = False
        self._cancel = None
        self._steered = 0
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
        # Oldest first: the offer out (its answer will be ignored), the steer batch, the queue.
        if self._offered is not None:
            dropped += self._offered.messages
            self._offered = None
        dropped += self._steer
        self._steer = []
        self._steer_due = False
        dropped += self._pending
        if dropped:
            effects.append(Dropped(tuple(dropped)))
        self._pending = []
        self._timer_at = None
        return effects

    def drain(self) -> list[Effect]:
        """Shutdown: a granted run that has not begun never will; its messages queue again.

        A begun run is offered no more steer batches (the owner passes
        ``queue`` from now on): what gathers to steer queues, to stay
        pending for the restart. An offer out is still answered.
        """
        self._unsteer()
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
        self._unsteer()
        self._cancel = reason
        return [CancelRun(self._run, reason)]

    # -- internals -----------------------------------------------------------

    def _window_from(self, opens: bool, at: float) -> None:
        """A message that arrived ``at`` (re)starts the window; a batch's window only
        ever moves later (one armed timer per batch relies on it), so a message
        recorded late, having arrived before the last one, leaves it where it is."""
        if opens:
            self._first_at = self._last_at = at
        else:
            self._last_at = max(self._last_at, at)

    def _deadline(self) -> float:
        latest = self._first_at + self._limits.max_wait_s
        if self._idle_s is None:
            return min(self._last_at + self._limits.coalesce_s, latest)
        if self._sender_typing():
            return latest
        return min(self._last_at + self._idle_s, latest)

    def _sender_typing(self) -> bool:
        """A sender of the open (or steer) batch's messages is typing."""
        if not self._typing:
            return False
        gathering = self._steer if self._run is not None else self._pending
        return any(message.sender in self._typing for message in gathering)

    def _steers(self, message: Message) -> bool:
        """Whether ``message`` may steer the run.

        Only a run that has begun and is not being cancelled takes input, and
        only while nothing is queued: a steered message would overtake it.
        Only from the run's thread: its answers go there.
        """
        return (
            self._run is not None
            and self._began
            and self._cancel is None
            and not self._pending
            and message.thread == self._run.first.thread
        )

    def _steer_arrived(
        self, message: Message, now: float, at: float, *, interrupt: bool
    ) -> list[Effect]:
        self._steer.append(message)
        self._interrupt = interrupt
        if self._steer_due:
            return []  # due already: offered when the offer out is answered
        self._window_from(len(self._steer) == 1, at)
        if len(self._steer) >= self._limits.max_batch or now >= self._deadline():
            return self._steer_ready()
        if self._timer_at is None:
            self._timer_at = self._deadline()
            return [ArmTimer(self._timer_at)]
        return []

    def _steer_ready(self) -> list[Effect]:
        self._timer_at = None
        if self._offered is not None:
            # One offer at a time keeps the order: the run answers this one first.
            self._steer_due = True
            return []
        return self._offer()

    def _offer(self) -> list[Effect]:
        size = self._limits.max_batch
        self._offered = Batch(self.key, tuple(self._steer[:size]))
        del self._steer[:size]
        # Messages over max_batch waited through the closed window: due at once.
        self._steer_due = bool(self._steer)
        return [SteerRun(self._offered, self._interrupt)]

    def _unoffer(self) -> None:
        """The offer out will not be taken (the run ended): it heads the queue."""
        if self._offered is not None:
            self._pending[:0] = self._offered.messages
            self._offered = None

    def _unsteer(self) -> None:
        """The gathering steer batch queues instead, ahead of what queued since."""
        if self._steer:
            self._pending[:0] = self._steer
            self._steer = []
        if self._run is not None:
            self._timer_at = None  # only the steer window is armed while running
        self._steer_due = False

    def _become_ready(self) -> list[Effect]:
        self._ready = True
        self._timer_at = None
        return [REQUEST_SLOT]


def _one_thread(messages: list[Message], limit: int) -> int:
    """How many of ``messages`` (at most ``limit``) from the first on share its thread.

    A batch is answered in its first message's thread, so it never takes a
    message from another: that one heads the next batch, ready when this run ends.
    """
    if not messages:
        return 0
    thread = messages[0].thread
    count = 1
    while count < min(limit, len(messages)) and messages[count].thread == thread:
        count += 1
    return count

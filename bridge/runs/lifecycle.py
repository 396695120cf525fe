"""One run's lifecycle, as a pure state machine.

:func:`advance` takes a :class:`RunState` and an event and answers with the next
state and the actions for the executor to carry out; it never awaits, reads a clock
or touches a process. Every way out of a run goes through exactly one ending action
(:class:`End`, :class:`Leave`, :class:`Drop`, :class:`AbandonStart`, :class:`GiveUp`);
the outcome, with its cost, is recorded once (:class:`Conclude`, or :class:`End` with
``record``); a run in a final phase stays there (an ended one still notes what its
ending found). The phases and what each ending does: docs/live-runs.md, "A run's
lifecycle".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from bridge.core.model import RunStatus
from dispatcher import EndReason


class Phase(StrEnum):
    PREPARED = "prepared"
    """Dispatched: its start is being recorded."""
    STARTED = "started"
    """Its start is recorded; no claude was spawned for it (yet, or again after a retry)."""
    RUNNING = "running"
    """claude was spawned for it: it has, or may have, the prompt."""
    ANSWERED = "answered"
    """claude printed the answer: its record, begun at once, is the run's outcome."""
    STOPPING = "stopping"
    """The dispatcher cancelled it (a stop, a shutdown): the runner stops claude."""
    ENDED = "ended"
    """Its outcome was recorded here (final)."""
    UNSTARTED = "unstarted"
    """It never started: its messages stay pending, or were dropped by a stop (final)."""
    DETACHED = "detached"
    """Left to its supervisor at a detaching shutdown; the next start reattaches it (final)."""
    MOVED = "moved"
    """Another replica owns its conversation and runs its messages (final)."""


FINAL = frozenset({Phase.ENDED, Phase.UNSTARTED, Phase.DETACHED, Phase.MOVED})


@dataclass(frozen=True, slots=True)
class RunState:
    """Where one run is; the executor keeps it and feeds it events."""

    phase: Phase = Phase.PREPARED
    stop: EndReason | None = None
    """Why the dispatcher cancelled it, once it did (as it says now)."""
    reached: bool = False
    """claude was spawned for it (reattached runs start so)."""
    final: bool = False
    """claude printed its last result: nothing more goes into the run."""
    concluded: bool = False
    """The outcome's record was begun (at the answer, or at the end)."""
    detached: bool = False
    """Decided at a detaching shutdown: left to its supervisor."""
    lost: bool = False
    """It ended after this replica lost the conversation: nothing of its end is shown here."""
    unrecorded: bool = False
    """Its outcome could not be recorded: it stays marked running for the next start."""

    @property
    def over(self) -> bool:
        return self.phase in FINAL


def reattached() -> RunState:
    """A run a previous process started and left running: claude has its prompt."""
    return RunState(Phase.RUNNING, reached=True)


@dataclass(frozen=True, slots=True)
class StartRecorded:
    """The store took the run's start."""


@dataclass(frozen=True, slots=True)
class StartRefused:
    """The start could not be recorded (another replica holds the room, or the store
    kept failing): nothing of the run exists."""


@dataclass(frozen=True, slots=True)
class Stopping:
    """The dispatcher cancels the run for ``reason`` (None: the service is failing)."""

    reason: EndReason | None


@dataclass(frozen=True, slots=True)
class ClaudeSpawned:
    """claude was spawned for the run (or a prestarted one was given it)."""


@dataclass(frozen=True, slots=True)
class Retried:
    """claude lost the session: the first try was undone, a second one starts."""


@dataclass(frozen=True, slots=True)
class Answered:
    """claude printed the run's answer (a success, the end rule held)."""


@dataclass(frozen=True, slots=True)
class ErrorResult:
    """claude printed the run's last result, an error."""


@dataclass(frozen=True, slots=True)
class DetachAsked:
    """The runner asks, as a shutdown cancels it, whether the run is left to its
    supervisor; ``registered``: the registry has it (a restart must find it)."""

    registered: bool


@dataclass(frozen=True, slots=True)
class Lost:
    """The replica lost the run's conversation before its end was shown."""


@dataclass(frozen=True, slots=True)
class Unrecorded:
    """The outcome could not be recorded."""


@dataclass(frozen=True, slots=True)
class DriveEnded:
    """The run's drive returned (or failed inside chatbridge); ``not_started``: claude was
    never given the prompt because the room moved."""

    not_started: bool = False


@dataclass(frozen=True, slots=True)
class DriveCancelled:
    """The drive ended by the dispatcher's cancellation. ``holds``: this replica owns the
    room; ``dir_made``: a spawn got as far as the run's directory."""

    holds: bool = True
    dir_made: bool = False


Event = (
    StartRecorded
    | StartRefused
    | Stopping
    | ClaudeSpawned
    | Retried
    | Answered
    | ErrorResult
    | DetachAsked
    | Lost
    | Unrecorded
    | DriveEnded
    | DriveCancelled
)


@dataclass(frozen=True, slots=True)
class Conclude:
    """Record the answer as the outcome, with its cost, and hand it to the outbox now."""


@dataclass(frozen=True, slots=True)
class End:
    """End the run here: ``record`` the outcome (else the answer's record is it), as
    ``cancelled`` says when the dispatcher cancelled it; then the cosmetics, the clean-up."""

    record: bool
    cancelled: RunStatus | None = None


@dataclass(frozen=True, slots=True)
class Leave:
    """Leave the run to its supervisor: its progress is noted, nothing recorded."""


@dataclass(frozen=True, slots=True)
class Drop:
    """Nothing of the run's end is recorded or told here; nothing of it stays either."""


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The run never started: a claude started for it goes (``why``: for the metrics)."""

    why: str


@dataclass(frozen=True, slots=True)
class AbandonStart:
    """Cancelled before its start was through: recorded as ``status`` if recorded at all."""

    status: RunStatus


Action = Conclude | End | Leave | Drop | GiveUp | AbandonStart

ENDINGS = (End, Leave, Drop, GiveUp, AbandonStart)
"""The actions that end a run: exactly one per run."""

CONCLUDE = Conclude()
LEAVE = Leave()
DROP = Drop()


def cancelled_status(stop: EndReason | None) -> RunStatus:
    """How a cancelled run is recorded: as the dispatcher says it ended."""
    if stop is EndReason.STOPPED:
        return RunStatus.STOPPED
    return RunStatus.INTERRUPTED  # shutdown, or a failing service


def advance(state: RunState, event: Event) -> tuple[RunState, tuple[Action, ...]]:
    """The state after ``event`` and what to do; a final state takes nothing (but what
    carrying out an ending finds: a lost room, an outcome not recorded)."""
    if state.over:
        return _while_ending(state, event), ()
    match event:
        case Stopping(reason=reason):
            return _stopping(state, reason), ()
        case DriveCancelled():
            return _cancelled(state, event)
        case _ if state.phase is Phase.PREPARED:
            return _before_start(state, event)  # (no drive runs before the start is through)
        case DriveEnded(not_started=True) if not state.concluded:
            return replace(state, phase=Phase.MOVED), (DROP,)
        case DriveEnded():
            return _ended(state, End(record=not state.concluded))
        case _:
            return _under_way(state, event)


def _stopping(state: RunState, reason: EndReason | None) -> RunState:
    # The latest reason stands: the dispatcher may restate it (a stop after a shutdown).
    stopped = replace(state, stop=reason)
    if state.phase in (Phase.STARTED, Phase.RUNNING):
        return replace(stopped, phase=Phase.STOPPING)
    return stopped  # prepared: stops once its start is through; answered: the answer stands


def _before_start(state: RunState, event: Event) -> tuple[RunState, tuple[Action, ...]]:
    match event:
        case StartRecorded():
            phase = Phase.STARTED if state.stop is None else Phase.STOPPING
            return replace(state, phase=phase), ()
        case StartRefused():
            return replace(state, phase=Phase.UNSTARTED), (GiveUp("failed"),)
        case _:
            return state, ()


def _under_way(state: RunState, event: Event) -> tuple[RunState, tuple[Action, ...]]:
    match event:
        case ClaudeSpawned():
            running = Phase.RUNNING if state.phase is Phase.STARTED else state.phase
            return replace(state, phase=running, reached=True), ()
        case Retried() if not state.concluded:
            # (``final`` stays: the first try's error result closed the run to steering.)
            again = Phase.STARTED if state.phase is Phase.RUNNING else state.phase
            return replace(state, phase=again, reached=False), ()
        case Answered() if not (state.concluded or state.detached):
            # (Read after the run was left to its supervisor: the next start replays it.)
            answered = replace(state, phase=Phase.ANSWERED, final=True, concluded=True)
            return answered, (CONCLUDE,)
        case ErrorResult():
            return replace(state, final=True), ()
        case DetachAsked(registered=registered):
            detached = state.stop is EndReason.DETACHED and registered and not state.concluded
            return replace(state, detached=detached), ()
        case Lost():
            return replace(state, lost=True), ()
        case Unrecorded():
            return replace(state, unrecorded=True), ()
        case _:
            return state, ()


def _while_ending(state: RunState, event: Event) -> RunState:
    """An ended run's ending is still being carried out: what it finds is noted."""
    if state.phase is not Phase.ENDED:
        return state
    match event:
        case Lost():
            return replace(state, lost=True)
        case Unrecorded():
            return replace(state, unrecorded=True)
        case _:
            return state


def _cancelled(state: RunState, event: DriveCancelled) -> tuple[RunState, tuple[Action, ...]]:
    status = cancelled_status(state.stop)
    if state.phase is Phase.PREPARED:
        return replace(state, phase=Phase.UNSTARTED), (AbandonStart(status),)
    if state.detached:
        return replace(state, phase=Phase.DETACHED), (LEAVE,)
    if not (state.reached or event.dir_made) and not event.holds:
        # The conversation moved before claude got the prompt: its new owner finds the
        # run never began and runs its messages (recorded here, it would be interrupted).
        return replace(state, phase=Phase.MOVED), (DROP,)
    return _ended(state, End(record=not state.concluded, cancelled=status))


def _ended(state: RunState, end: End) -> tuple[RunState, tuple[Action, ...]]:
    return replace(state, phase=Phase.ENDED, concluded=True), (end,)

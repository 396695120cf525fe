"""What one run carries while it goes on: what finishing it needs (:class:`Run`) and what
runs beside claude for it (:class:`Live`, with its lifecycle state), shared by the
executor's parts (docs/live-runs.md, "A run's lifecycle").
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from bridge.core.model import Batch, LiveRun, RunId, RunReport, SessionId
from bridge.outbound.progress import ProgressMessage
from bridge.runs.changes import Snapshot
from bridge.runs.lifecycle import Action, DetachAsked, Event, RunState, Stopping, advance
from bridge.runs.prestarts import Taken
from bridge.store.base import RoomOverrides
from dispatcher import DispatchedRun
from runner.control import RunControl
from runner.events import Init, Result, UsageLimited

STORE_RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 4.0)
"""Pauses between tries of a failing store write at a run's start and end."""


async def give_up(taken: Taken | None, why: str) -> None:
    """The run never started: its prestart, if any, goes (nothing of it is left)."""
    if taken is not None:
        await taken.give_up(why)


async def nothing() -> None:
    """The wait for replies when there are none."""


def with_claude_figures(report: RunReport, result: Result | None) -> RunReport:
    """``report`` with what claude's last ``result`` said of the run (its cost, turns,
    time) where the report has none: a stopped or interrupted turn's result still
    tells what the process spent (``total_cost_usd`` is the process's sum so far).
    No result: the cost stays unknown (None), never zero."""
    if result is None:
        return report
    return replace(
        report,
        cost_usd=report.cost_usd if report.cost_usd is not None else result.cost_usd,
        num_turns=report.num_turns if report.num_turns is not None else result.num_turns,
        duration_ms=report.duration_ms if report.duration_ms is not None else result.duration_ms,
    )


def steer_uuid(run_id: RunId, batch: Batch) -> str:
    """The uuid a steered batch is written into claude under: made of the run and the
    messages, so a restart can tell from the journal whether it was written."""
    ids = ",".join(str(i) for i in batch.ids)
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"chatbridge:steer:{run_id}:{ids}"))


@dataclass(frozen=True, slots=True)
class Run:
    """What finishing a run needs to know about it."""

    id: RunId
    batch: Batch
    started: float
    generation: int
    """The room's ``!reset`` generation when the run started."""
    progress: ProgressMessage


RoomState = asyncio.Task[tuple[SessionId | None, RoomOverrides]]
"""The room's session and overrides, read for a run's request."""


@dataclass(slots=True)
class Live:
    """What runs beside claude for one run; each task is awaited when the run ends."""

    dispatched: DispatchedRun | None = None
    """The dispatcher's handle: its ``end_reason`` says whether a cancellation detaches."""
    shown: int = -1
    """The journal offset up to which the room has seen the run's progress: a run
    reattached after a restart does not show its earlier tool uses again."""
    position: int = 0
    """The journal offset just past the line whose events are being handled."""
    supervisor: LiveRun | None = None
    """Where the run's detached supervisor is reached, once claude was spawned."""
    registered: asyncio.Task[bool] | None = None
    """Writes the run into the registry of live runs; True once it is there (synced)."""
    room_state: RoomState | None = None
    """The room's session and overrides for the request, read beside the start's record."""
    offsets: asyncio.Task[None] | None = None
    """Keeps the registry's delivered offset up with what the room was shown."""
    shown_moved: asyncio.Event = field(default_factory=asyncio.Event)
    state: RunState = field(default_factory=RunState)
    """Its phase and what was decided of its end (bridge/runs/lifecycle.py)."""
    opening: asyncio.Task[bool] | None = None
    """Phase and typing, started once claude is spawned (and registered); its result:
    whether it showed them (not when the answer came first)."""
    pump: asyncio.Task[None] | None = None
    """The progress message, posted once the run has lasted ``show_after_s``."""
    answer: asyncio.Task[Callable[[], Awaitable[None]]] | None = None
    """Records the answer and hands it to the outbox, from the moment claude printed it."""
    concluding: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the answer exists or the run's end is being shown: from then on the room
    is not shown the run running (see :meth:`RunExecutor._opening`)."""
    init: Init | None = None
    result: Result | None = None
    """The last result claude printed (any turn's, an interrupted one's too): its cost
    is the run's (see :func:`with_claude_figures`)."""
    control: RunControl = field(default_factory=RunControl)
    """The run's input side: steering, answers to tool requests, model and mode."""
    held: tuple[Result, int] | None = None
    """A replayed result (and its offset) nothing was pending at: the run's answer, or an
    earlier turn's if another result follows (see :meth:`RunExecutor._on_result`)."""
    side: set[asyncio.Task[None]] = field(default_factory=set)
    """Tool requests being asked in the room, steered messages being recorded."""
    asking: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    """The task asking the room each of claude's requests, by request id: a withdrawal
    is recorded only after its request was (else the request would be posted after it)."""
    limited: UsageLimited | None = None
    baseline: Snapshot | None = None
    """The run's git working directory before claude got the prompt (``summarize_changes``)."""
    """claude said the account's usage limit refused the run (see :mod:`bridge.runs.usage`)."""
    journal_trouble: bool = False
    """The room was told its journal cannot be written (once per run)."""
    steered: list[Batch] = field(default_factory=list)
    """The batches recorded into the run (shown running): the run's end shows them its outcome."""
    before_end: list[asyncio.Task[None]] = field(default_factory=list)
    """Steered messages being recorded into the run, earlier turns' answers being put
    into the outbox: both come before the run's end is recorded."""

    def feed(self, event: Event) -> tuple[Action, ...]:
        """Advance the run's lifecycle by ``event``; the actions it calls for."""
        self.state, actions = advance(self.state, event)
        return actions

    def stopping(self) -> None:
        """The dispatcher cancelled the run: its lifecycle learns why (as it says now)."""
        self.feed(Stopping(self.dispatched.end_reason if self.dispatched is not None else None))

    def beside(self, task: asyncio.Task[None]) -> None:
        self.side.add(task)
        task.add_done_callback(self.side.discard)

    def at(self, offset: int) -> None:
        """The runner's ``on_position``: the next events are those of the line ending here."""
        self.position = offset

    def detach(self) -> bool:
        """Leave the run to its supervisor? Asked by the runner when a shutdown cancels it.

        Only a run in the registry (a restart must find it) and not answered
        yet (an answer already read is recorded by this process, not replayed
        by the next); the decision is kept, so the executor acts on the same.
        """
        registered = self.registered
        self.stopping()
        self.feed(
            DetachAsked(
                registered is not None
                and registered.done()
                and not registered.cancelled()
                and registered.result()
            )
        )
        return self.state.detached


def shown_running(live: Live) -> bool:
    """Whether the room was shown the run running (typing on): its opening says so.
    One that failed or was cut off may have got as far as typing: cleared too."""
    opening = live.opening
    if opening is None or not opening.done():
        return opening is not None
    return opening.cancelled() or opening.exception() is not None or opening.result()


def being_stopped(live: Live) -> bool:
    """The dispatcher is cancelling the run (a stop, a shutdown)."""
    return live.dispatched is not None and live.dispatched.end_reason is not None


async def wind_down(live: Live) -> None:
    """Cancel what runs beside the run (opening, progress, offsets) and wait for it all,
    the registration included (a store write, bounded by the store)."""
    beside = [t for t in (live.opening, live.pump, live.offsets) if t is not None]
    beside += live.side
    for task in beside:
        task.cancel()
    await asyncio.gather(*filter(None, (live.registered,)), *beside, return_exceptions=True)

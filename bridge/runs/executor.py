"""Executes one batch: record the run, drive claude, report back, record the outcome.

The dispatcher calls :meth:`RunExecutor.execute` in a task it owns and cancels it to stop
the run; the run is recorded as the dispatcher says it ended (stopped or interrupted).
claude's first non-error ``result`` is the outcome, recorded with its reply in one
transaction and handed to the outbox at once; cosmetic updates come after, bounded.
Whatever fails, the run ends with one outcome and the room is free for its next batch
(docs/operations.md, "Answers and rate limits"; docs/live-runs.md, "Messages during a run";
docs/replicas.md, "Replicas and leases", for a run whose conversation moved).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bridge.config import RoomSettings, Settings
from bridge.core import stages
from bridge.core.aio import shielded
from bridge.core.model import (
    Batch,
    ExternalMessageId,
    LiveRun,
    Message,
    Reply,
    ReplyKind,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
    SessionId,
)
from bridge.core.text import safe_text
from bridge.core.transport import RunPhase
from bridge.host.logs import log_context
from bridge.host.worktrees import WorktreeError, Worktrees, in_worktree
from bridge.live.approval_flow import ApprovalFlow
from bridge.live.registry import LiveRuns
from bridge.metrics import Metrics
from bridge.outbound.notices import Notices
from bridge.outbound.outbox import Outbox
from bridge.outbound.progress import ProgressMessage
from bridge.outbound.replies import Replier, in_conversation
from bridge.runs.budget import Budgets
from bridge.runs.changes import Changes, Snapshot, changes, snapshot, summary_line
from bridge.runs.file_posts import FilePosts, send_file_rules
from bridge.runs.inbox import FetchedFile, FileLimits, Inbox, shown_images
from bridge.runs.prestarts import Prestarts, Taken
from bridge.runs.prompt import build_prompt
from bridge.runs.transcripts import Transcripts
from bridge.runs.usage import LimitResumes, usage_limit
from bridge.store.base import (
    STEERED,
    AuditAction,
    Fence,
    OutboxEntry,
    RegisteredRun,
    RoomOverrides,
    Store,
    StoreError,
)
from bridge.store.cluster import ClusterFull, Fenced
from bridge.store.rules import delivery_key
from dispatcher import DispatchedRun, EndReason, Execute
from runner import (
    EventCallback,
    Prestarted,
    PromptImage,
    RunRequest,
    Spares,
    answer_report,
    attach_claude,
    remove_run_dir,
    run_claude,
    run_dir_made,
)
from runner.control import InputClosed, RunControl
from runner.events import (
    Init,
    JournalUnwritable,
    PermissionAsked,
    PermissionCancelled,
    Result,
    RunEvent,
    Spawned,
    ToolUse,
    UsageLimited,
)

log = logging.getLogger(__name__)

CLUSTER_FULL_RETRY_S = 1.0
"""How often a start waiting for a cluster slot tries again (``[cluster] max_concurrent_runs``)."""

RECORD_TIMEOUT_S = 60.0
"""Recording a run's end (with retries) gives up after this long: the room is freed."""
STORE_RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 4.0)
"""Pauses between tries of a failing store write at a run's start and end."""
START_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
"""Pauses between tries of a failing ``start_run`` (about a minute in all)."""
COSMETIC_TIMEOUT_S = 10.0
"""Each cosmetic update at a run's end, and the wait for the answer before them."""
TYPING_AFTER_S = 0.25
"""How long a run has claude before the room is shown it running (typing, the phase): an
answer that comes sooner (a claude started ahead answers within milliseconds) goes out
alone, with no typing on and off, two requests of the homeserver's, around it."""
OFFSET_WRITE_INTERVAL_S = 1.0
"""The registry's delivered offset is written at most this often per run (not synced)."""
TRANSCRIPT_SAVE_TIMEOUT_S = 60.0
"""Saving a session's transcript to the database after a run gives up after this long."""
PROGRESS_FINISH_TIMEOUT_S = 120.0
"""The progress message's last edit waits this long at most for the transport's edit budget
(Matrix's 6 edits a minute, slowed to an eighth by rate limits, give one in 80 s)."""


def new_run_id() -> RunId:
    return RunId(f"run-{secrets.token_hex(8)}")


def run_request(  # noqa: PLR0917 (the run's parts, in order)
    settings: Settings,
    room: RoomSettings,
    run_id: RunId,
    prompt: str,
    session: SessionId | None,
    overrides: RoomOverrides | None = None,
) -> RunRequest:
    """The request for a run of ``room``; ``overrides``: what ``!model`` / ``!mode`` set."""
    overrides = overrides or RoomOverrides()
    return RunRequest(
        run_id=run_id,
        claude_bin=settings.runner.claude_bin,
        cwd=room.cwd,
        prompt=prompt,
        session_id=session,
        fork_session=overrides.fork and session is not None,
        model=overrides.model if overrides.model is not None else room.model,
        permission_mode=(
            overrides.permission_mode
            if overrides.permission_mode is not None
            else room.permission_mode
        ),
        approve_tools=room.approve_tools,
        allowed_tools=room.allowed_tools + send_file_rules(room),
        disallowed_tools=room.disallowed_tools,
        append_system_prompt=room.append_system_prompt,
        max_turns=room.max_turns,
        max_budget_usd=room.max_budget_usd,
        env=room.env,
        extra_args=room.extra_args,
        run_timeout_s=room.run_timeout_s,
        idle_timeout_s=room.idle_timeout_s,
        stop_grace_s=settings.runner.stop_grace_s,
        max_line_bytes=settings.runner.max_line_bytes,
        cgroup_parent=settings.runner.cgroup_root,
        memory_max=room.memory_max,
        pids_max=room.pids_max,
        state_dir=settings.runner.state_dir,
        orphan_timeout_s=settings.runner.orphan_timeout_s,
        spool_max_bytes=settings.runner.spool_max_bytes,
        send_file_max_bytes=room.max_send_file_bytes if room.send_files else None,
    )


_OUTCOME_WORDS: dict[RunStatus, str] = {
    RunStatus.SUCCEEDED: "Done",
    RunStatus.FAILED: "Failed",
    RunStatus.STOPPED: "Stopped",
    RunStatus.TIMED_OUT: "Timed out",
    RunStatus.STALLED: "Stalled",
    RunStatus.INTERRUPTED: "Interrupted",
}

MOVED = "Moved to another replica"
"""The progress message's last words on a replica that lost the run's conversation before
claude got the prompt (the new owner runs the messages and posts a message of its own)."""

LEFT_RUNNING = "Left running at a restart"
"""The progress message's last words from a process that leaves its run at shutdown
(the next start posts a message of its own)."""

_PHASES: dict[RunStatus, RunPhase] = {
    RunStatus.SUCCEEDED: RunPhase.DONE,
    RunStatus.STOPPED: RunPhase.STOPPED,
    RunStatus.INTERRUPTED: RunPhase.STOPPED,
}


def failure_text(report: RunReport, room: RoomSettings, prefix: str, run_id: RunId) -> str:
    """What the room is told when a run did not succeed; a retryable run offers ``!retry``.

    The offer names the run: it stays valid until that run is retried or the
    conversation moves on (see ``Store.retryable_runs``), also after a restart.
    """
    text = _failure_words(report, room)
    if report.status.retryable:
        text += f" `{prefix}retry {run_id}` runs it again."
    return text


def _failure_words(report: RunReport, room: RoomSettings) -> str:
    match report.status:
        case RunStatus.TIMED_OUT:
            return f"The run was stopped after its time limit of {room.run_timeout_s:g}s."
        case RunStatus.STALLED:
            return f"The run was stopped: claude printed nothing for {room.idle_timeout_s:g}s."
        case RunStatus.STOPPED:
            return "The run was stopped."
        case RunStatus.INTERRUPTED:
            return "The run was interrupted: chatbridge stopped before it finished."
        case _:
            return f"The run failed: {report.error or 'unknown error'}"


_NOT_KEPT = frozenset({RunStatus.STOPPED, RunStatus.INTERRUPTED})
"""Ends after which no claude is kept warm for the room: a stop, a shutdown, a lost room."""


def _cancelled_status(dispatched: DispatchedRun) -> RunStatus:
    """How a cancelled run is recorded: as the dispatcher says it ended."""
    if dispatched.end_reason is EndReason.STOPPED:
        return RunStatus.STOPPED
    return RunStatus.INTERRUPTED  # shutdown, or a failing service


class _Left(enum.Enum):
    """A run's ending that records no outcome here."""

    DETACHED = "detached"
    """Left to its supervisor at a detaching shutdown: the next start reattaches it."""
    MOVED = "moved"
    """Never began here; another replica owns the conversation and runs its messages."""


async def _nothing() -> None:
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
class _Run:
    """What finishing a run needs to know about it."""

    id: RunId
    batch: Batch
    started: float
    generation: int
    """The room's ``!reset`` generation when the run started."""
    progress: ProgressMessage


@dataclass(frozen=True, slots=True)
class _Refusal:
    """Why a run may not start now: its room is told ``error``."""

    error: str
    budget: str | None = None
    """The budget that refused it (``room`` or ``service``), if one did."""


_RoomState = asyncio.Task[tuple[SessionId | None, RoomOverrides]]
"""The room's session and overrides, read for a run's request."""


@dataclass(slots=True)
class _Live:
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
    room_state: _RoomState | None = None
    """The room's session and overrides for the request, read beside the start's record."""
    offsets: asyncio.Task[None] | None = None
    """Keeps the registry's delivered offset up with what the room was shown."""
    shown_moved: asyncio.Event = field(default_factory=asyncio.Event)
    detached: bool = False
    """The run was left to its supervisor at shutdown (see :meth:`detach`)."""
    end_unrecorded: bool = False
    """Its outcome could not be recorded: it stays marked running for the next start."""
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
    lost: bool = False
    """It ended after this replica lost the conversation: nothing of its end is shown here."""
    result: Result | None = None
    """The last result claude printed (any turn's, an interrupted one's too): its cost
    is the run's (see :func:`with_claude_figures`)."""
    control: RunControl = field(default_factory=RunControl)
    """The run's input side: steering, answers to tool requests, model and mode."""
    held: tuple[Result, int] | None = None
    """A replayed result (and its offset) nothing was pending at: the run's answer, or an
    earlier turn's if another result follows (see :meth:`RunExecutor._on_result`)."""
    final: bool = False
    """claude printed the run's last result (the end rule held): nothing more goes in."""
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
        self.detached = (
            self.dispatched is not None
            and self.dispatched.end_reason is EndReason.DETACHED
            and registered is not None
            and registered.done()
            and not registered.cancelled()
            and registered.result()
            and self.answer is None
        )
        return self.detached


def _shown_running(live: _Live) -> bool:
    """Whether the room was shown the run running (typing on): its opening says so.
    One that failed or was cut off may have got as far as typing: cleared too."""
    opening = live.opening
    if opening is None or not opening.done():
        return opening is not None
    return opening.cancelled() or opening.exception() is not None or opening.result()


def _unwritable_text(error: str) -> str:
    return (
        f"chatbridge cannot write to its state directory ({error}; most likely its disk is"
        " full). This run goes on: claude's output is kept in memory and the answer comes"
        " as usual. Tell the operator: the disk needs space."
    )


def _stopping(live: _Live) -> bool:
    """The dispatcher is cancelling the run (a stop, a shutdown)."""
    return live.dispatched is not None and live.dispatched.end_reason is not None


async def _wind_down(live: _Live) -> None:
    """Cancel what runs beside the run (opening, progress, offsets) and wait for it all,
    the registration included (a store write, bounded by the store)."""
    beside = [t for t in (live.opening, live.pump, live.offsets) if t is not None]
    beside += live.side
    for task in beside:
        task.cancel()
    await asyncio.gather(*filter(None, (live.registered,)), *beside, return_exceptions=True)


@dataclass(slots=True)
class RunExecutor:
    """Runs batches for the dispatcher: one :meth:`execute` call per run."""

    settings: Settings
    store: Store
    replier: Replier
    metrics: Metrics
    outbox: Outbox
    notices: Notices
    wall_clock: Callable[[], float] = time.time
    progress_interval_s: float = 2.0
    store_retry_delays_s: tuple[float, ...] = STORE_RETRY_DELAYS_S
    start_retry_delays_s: tuple[float, ...] = START_RETRY_DELAYS_S
    cosmetic_timeout_s: float = COSMETIC_TIMEOUT_S
    typing_after_s: float = TYPING_AFTER_S
    progress_finish_timeout_s: float = PROGRESS_FINISH_TIMEOUT_S
    live_runs: LiveRuns = field(default_factory=LiveRuns)
    """The runs going on now, by room (commands, buttons and steering reach them)."""
    approvals: ApprovalFlow | None = None
    """Asks the room about tool uses (``approve_tools``); None: requests are not asked."""
    prestarts: Prestarts | None = None
    """Claudes started while their batch gathered (``[runner] prestart``)."""
    spares: Spares | None = None
    """Supervisors started ahead of their runs (runner/spare.py); None: each run starts its own."""
    worktrees: Worktrees = field(default_factory=Worktrees)
    """Thread conversations' git worktrees (``worktree = true``)."""
    limits: LimitResumes | None = None
    """Tells the room about usage limits and retries after them; None: a plain failure."""
    inbox: Inbox | None = None
    """Fetches the files shared with a batch into the run's inbox; None: files are only named."""
    file_posts: FilePosts | None = None
    """Posts the files claude sends with ``send_file`` (docs/files.md); None: not posted."""
    fence_of: Callable[[RoomKey], Fence | None] = lambda room: None
    """The replica's claim a run's start is recorded under (docs/replicas.md); None alone."""
    holds: Callable[[RoomKey], bool] = lambda room: True
    """Whether this replica owns the room now (docs/replicas.md); alone, always."""
    transcripts: Transcripts | None = None
    """Carries sessions between replicas through the database (docs/replicas-sessions.md);
    None: made from ``[runner] transcripts_in_db`` (off: sessions stay on this host)."""
    _finishing: set[asyncio.Task[None]] = field(default_factory=set)
    """The progress messages' last edits still under way (see :meth:`drain`)."""
    _generations: dict[RoomKey, int] = field(default_factory=dict)
    """Bumped by ``!reset``: a run that began before keeps its session to itself."""

    def __post_init__(self) -> None:
        runner = self.settings.runner
        # Replicas always keep them: the next run may be another replica's.
        keep = runner.transcripts_in_db or self.settings.cluster.enabled
        if self.transcripts is None and keep:
            self.transcripts = Transcripts(self.store, runner.transcript_max_bytes, self.wall_clock)

    async def reset_session(self, room: RoomKey) -> None:
        """Forget the room's Claude session, also for the run active now, and a ``!fork``
        of it not yet used (it would fork whatever session comes next)."""
        self._generations[room] = self._generations.get(room, 0) + 1
        await self.store.set_session(room, None)
        await self.store.set_room_fork(room, False)

    async def drain(self, timeout_s: float) -> None:
        """At shutdown, while the transports still run: the progress messages' last
        edits under way get ``timeout_s``; those still waiting are then given up."""
        if not self._finishing:
            return
        log.info(
            "waiting up to %gs to finish %d progress message(s)", timeout_s, len(self._finishing)
        )
        _, late = await asyncio.wait(set(self._finishing), timeout=timeout_s)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)

    async def execute(self, dispatched: DispatchedRun) -> None:
        """The dispatcher's ``execute``: it never calls this while shutting down."""
        # The room's prestart whether or not the dispatcher announced one
        # (``dispatched.prestarted``): a claude kept warm since the room's last run is
        # the room's too, and left beside this run it would be a second claude of the
        # session. ``Taken.prestarted`` checks it still fits the request.
        taken = self.prestarts.take(dispatched.batch.room) if self.prestarts is not None else None
        run_id = taken.run_id if taken is not None else new_run_id()
        live = _Live(dispatched)
        # Set before the first await: a steer batch may come due at any time.
        generation = self._generations.get(dispatched.batch.room, 0)
        dispatched.steer = self._steer_hook(run_id, live, generation)
        with log_context(room=dispatched.batch.room, run=run_id):
            await self._execute(run_id, dispatched, live, taken, generation)

    async def _execute(
        self,
        run_id: RunId,
        dispatched: DispatchedRun,
        live: _Live,
        taken: Taken | None,
        generation: int,
    ) -> None:
        stages.stamp("dispatched")
        batch = dispatched.batch
        started = self.wall_clock()
        # Read beside the start's commit (a reader beside the writer): the request,
        # claude's prompt, needs it next.
        live.room_state = asyncio.create_task(
            self.store.room_state(batch.room), name=f"room state {run_id}"
        )
        try:
            try:
                recorded = await self._start(run_id, batch, started)
            except asyncio.CancelledError:
                await self._settle(self._cancelled_at_start(run_id, dispatched, taken))
                raise
            if not recorded:
                await self._settle(self._give_up(taken, "failed"))
                return
            stages.stamp("start_recorded")
            self.metrics.runs_started.inc()
            if len(batch.messages) > 1:
                self.metrics.coalesced.inc(len(batch.messages))
            run = _Run(run_id, batch, started, generation, self._progress(batch))
            await self._follow(run, live, dispatched, self._drive(run, live, taken))
        finally:
            # Taken by the request by now, unless the run ended before it.
            live.room_state.cancel()
            await asyncio.gather(live.room_state, return_exceptions=True)

    def reattach(self, entry: RegisteredRun, started: float) -> Execute:
        """The dispatcher's ``execute`` for a run a previous process started and left
        running (see :meth:`Dispatcher.adopt`): attach to its supervisor and carry on.

        The journal is replayed from its start (the session, the answer), but
        tool uses the room was already shown are not shown again.
        """
        run_id = entry.live.run_id

        async def execute(dispatched: DispatchedRun) -> None:
            batch = dispatched.batch
            with log_context(room=batch.room, run=run_id):
                room = self.settings.room(batch.room)
                if room is None:
                    raise RuntimeError(f"room {batch.room} is not configured")
                generation = self._generations.get(batch.room, 0)
                if await self._reset_since(batch.room, started):
                    # A !reset answered before the restart: the run's session is
                    # not to become the room's (a generation before the current).
                    generation -= 1
                run = _Run(run_id, batch, started, generation, self._progress(batch, started))
                live = _Live(dispatched, shown=entry.delivered_offset, supervisor=entry.live)
                dispatched.steer = self._steer_hook(run_id, live, generation)
                log.info("reattaching to the run (journal shown up to %d)", entry.delivered_offset)
                steered = await self._steered_into(run_id, batch)
                for into in steered:
                    live.control.promise(steer_uuid(run_id, into))
                if steered:
                    live.beside(
                        asyncio.create_task(
                            self._steer_unsent(run, live, steered), name=f"unsent {run_id}"
                        )
                    )
                request = run_request(
                    self.settings, in_worktree(batch.room, room), run_id, "", None
                )
                drive = attach_claude(
                    request,
                    entry.live,
                    self._on_event(run, live),
                    on_position=live.at,
                    detach=live.detach,
                    control=live.control,
                )
                await self._follow(run, live, dispatched, drive)

        return execute

    async def _steered_into(self, run_id: RunId, batch: Batch) -> list[Batch]:
        """The batches recorded as steered into a run a previous process followed (by
        the audit trail: one steer's rows share their time), in order."""
        try:
            trail = await self.store.audit_trail(run_id=run_id)
        except StoreError:
            log.warning("could not read which messages were steered into the run")
            return []
        steers: dict[float, list[Message]] = {}
        by_id = {m.id: m for m in batch.messages}
        for row in trail:
            if (
                row.action is AuditAction.MESSAGE_DISPATCHED
                and row.detail == STEERED
                and row.message_id in by_id
            ):
                steers.setdefault(row.at, []).append(by_id[row.message_id])
        return [Batch(batch.room, tuple(messages)) for messages in steers.values()]

    async def _steer_unsent(self, run: _Run, live: _Live, steered: list[Batch]) -> None:
        """A reattached run's steered batches, promised to it until the journal's history
        is read: one the previous process recorded and died before writing into claude
        (record, then send) is written now; if the run takes no more input, the room is
        told that claude never saw it."""
        control = live.control
        await control.attached()
        for batch in steered:
            uid = steer_uuid(run.id, batch)
            if control.sent(uid):
                control.withdraw(uid)  # written before the restart
            else:
                try:
                    control.send(build_prompt(batch), uid)
                except InputClosed:
                    control.withdraw(uid)
                    log.warning("a message recorded into the run never reached claude")
                    which = "Your messages" if len(batch.messages) > 1 else "Your message"
                    await self.notices.say(
                        batch.room,
                        f"{which} did not reach claude: chatbridge stopped as it was added"
                        f" to run `{run.id}`, which ended without it. Please send it again.",
                        about=batch,
                    )
                    continue
                log.info("%d recorded message(s) written into the run after the restart",
                         len(batch.messages))  # fmt: skip
            live.steered.append(batch)

    async def _reset_since(self, room: RoomKey, started: float) -> bool:
        """Whether the room's session was reset since ``started`` (by the audit trail: a
        process before this one may have answered the ``!reset``)."""
        try:
            trail = await self.store.audit_trail(room=room)
        except StoreError:
            return False
        return any(a.action is AuditAction.SESSION_RESET and a.at >= started for a in trail)

    async def _follow(
        self,
        run: _Run,
        live: _Live,
        dispatched: DispatchedRun,
        drive: Coroutine[Any, Any, RunReport],
    ) -> None:
        """Drive the run to its ending, and end it there (:meth:`_end`), once."""
        try:
            report = await drive
        except asyncio.CancelledError:
            await self._settle(self._end(run, live, self._cancelled_ending(run, live, dispatched)))
            raise
        except Exception as exc:
            log.exception("the run failed inside chatbridge")
            report = RunReport(
                RunStatus.FAILED, error=f"internal error ({type(exc).__name__}); see the log"
            )
        ending: RunReport | _Left = _Left.MOVED if report.not_started else report
        if ending is _Left.MOVED:
            log.warning(
                "run %s not started: %s moved to another replica, which runs its messages",
                run.id, run.batch.room,
            )  # fmt: skip
        # A !stop landing while the end is reported must not cut the answer off.
        await self._settle(self._end(run, live, ending))
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Cancelled after claude had printed its result: run_claude stopped
            # the run and returned the answer instead of raising, and the
            # answer is now recorded. The cancellation still propagates.
            raise asyncio.CancelledError
        if isinstance(ending, RunReport):
            self._keep_warm(run.batch.room, ending)

    def _cancelled_ending(
        self, run: _Run, live: _Live, dispatched: DispatchedRun
    ) -> RunReport | _Left:
        """How a run the dispatcher cancelled ends (the runner has stopped claude by now)."""
        if live.detached:
            return _Left.DETACHED  # left to its supervisor: the next start reattaches
        if not self._reached_claude(run, live) and not self.holds(run.batch.room):
            # The conversation moved (the cluster dropped the room) before claude
            # got the prompt: its new owner finds the run never began and runs its
            # messages. Recorded here, it would be interrupted, offering `!retry`.
            log.warning(
                "run %s cancelled before claude got the prompt: %s moved to another"
                " replica, which runs its messages",
                run.id, run.batch.room,
            )  # fmt: skip
            return _Left.MOVED
        # A stop interrupts claude's turn first: its session stays resumable, and the
        # interrupted turn's result says what it cost (added by _end). A run that had
        # printed its answer keeps it (the answer task records it).
        session = live.init.session_id if live.init is not None else None
        return RunReport(_cancelled_status(dispatched), session_id=session)

    async def _end(self, run: _Run, live: _Live, ending: RunReport | _Left) -> None:
        """Every ending of a run started here or reattached comes here, once: an outcome
        is recorded with the cost claude reported (unknown, None, if it printed no
        result) and its answer or notice; a run left to its supervisor or to another
        replica records nothing here (its end is recorded where it goes on)."""
        if ending is _Left.DETACHED:
            await self._leave(run, live)
            return
        if ending is _Left.MOVED:
            # Nothing recorded (the new owner does), but nothing of it stays here
            # either: a retry in a new session may come after a first try that ran.
            await self._drop(run, live)
            return
        held, live.held = live.held, None
        if held is not None and ending.status is not RunStatus.SUCCEEDED:
            # A result held back (a message was promised after it, or may have been sent
            # after it before a restart) that the run did not end on: an earlier turn's.
            self._turn_answered(run, live, *held)
        try:
            await self._finalize(run, live, with_claude_figures(ending, live.result))
        finally:
            # After the answer, before the room is free: the conversation's next run,
            # here or on another replica, resumes what this one left.
            await self._save_transcript(run, live)

    def _keep_warm(self, room: RoomKey, report: RunReport) -> None:
        """Start the room's next claude now (``prestart_keep_s``), after a run that ended
        on its own. Here its claude is gone (run_claude returns only then) and its
        outcome and session are recorded: the next one resumes that session."""
        if self.prestarts is None or report.status in _NOT_KEPT:
            return  # a stop, or the run's end was not its own (shutdown, replica lost)
        if self.settings.room(room) is None or not self.holds(room):
            return  # nothing of the room runs here any more
        self.prestarts.keep_warm(room)

    async def _start(self, run_id: RunId, batch: Batch, started: float) -> bool:
        """Record the run's start, retrying in order; False if the store kept failing.

        The batch keeps its room while this retries, so no newer message of
        the room can run before it.
        """
        delays = iter(self.start_retry_delays_s)
        told = full_told = False
        while True:
            try:
                await self.store.start_run(run_id, batch, started, self.fence_of(batch.room))
            except Fenced:
                # Another replica holds the conversation now: its messages are
                # still pending, and the new owner runs them.
                log.warning("run %s not started: %s moved to another replica", run_id, batch.room)
                return False
            except ClusterFull:
                # Not a failure: the batch keeps its place until a run ends somewhere.
                if not full_told:
                    full_told = True
                    await self.notices.say(
                        batch.room,
                        "Every run slot of the cluster is busy; this run starts when one frees.",
                        about=batch,
                    )
                await asyncio.sleep(CLUSTER_FULL_RETRY_S)
                continue
            except StoreError:
                delay = next(delays, None)
                if delay is None:
                    break
                log.warning("could not record the start of a run; trying again in %gs", delay)
            else:
                return True
            if not told:
                told = True
                await self.notices.say(
                    batch.room,
                    "The database is failing; the run starts as soon as it answers again.",
                    about=batch,
                )
            await asyncio.sleep(delay)
        # Nothing was recorded: the messages are still pending in the store and
        # run at the next start, in the order they were accepted.
        log.error("could not record the start of a run; its messages run after a restart")
        await self.notices.say(
            batch.room,
            "Could not start the run: the database kept failing. Your messages are kept"
            " and run when chatbridge restarts.",
            about=batch,
        )
        return False

    async def _settle(self, work: Coroutine[Any, Any, None]) -> None:
        """Finish ``work`` whatever happens to this task; a failure is logged, not raised."""
        try:
            await shielded(work)
        except Exception:
            # A bug at the end of a run must not leave the room busy forever.
            log.exception("the end of the run failed inside chatbridge")

    async def _give_up(self, taken: Taken | None, why: str) -> None:
        """The run never started: its prestart, if any, goes (nothing of it is left)."""
        if taken is not None:
            await taken.give_up(why)

    async def _cancelled_at_start(
        self, run_id: RunId, dispatched: DispatchedRun, taken: Taken | None
    ) -> None:
        status = _cancelled_status(dispatched)
        await self._give_up(taken, "dropped" if status is RunStatus.STOPPED else "shutdown")
        batch = dispatched.batch
        if await self.store.get_run(run_id) is not None:
            await self.store.finish_run(run_id, RunReport(status), self.wall_clock())
        elif status is RunStatus.STOPPED:
            await self.store.mark_dropped(batch.ids, None, self.wall_clock())
        # Interrupted and not recorded: the messages stay pending for the restart.

    async def _drive(self, run: _Run, live: _Live, taken: Taken | None) -> RunReport:
        """Run claude (again without the session if claude lost it); its last report."""
        batch = run.batch
        try:
            prepared = await self._prepare(run, taken, live.room_state)
        except BaseException as exc:
            # Ended before it reached claude (a !stop, a store that kept failing):
            # a claude started for it (prestarted, or kept warm) goes with it, or
            # it would run on past the run, beside the room's next one.
            why = "dropped" if isinstance(exc, asyncio.CancelledError) else "failed"
            await shielded(self._give_up(taken, why))
            raise
        if isinstance(prepared, RunReport):
            return prepared
        request, prestarted = prepared
        room = self.settings.room(batch.room)
        if room is not None and room.summarize_changes and live.baseline is None:
            # Before claude has the prompt: nothing of the run has touched the files yet.
            live.baseline = await self._baseline(request.cwd)
        session = request.session_id
        on_event = self._on_event(run, live)

        def attempt(request: RunRequest, prestarted: Prestarted | None) -> Awaitable[RunReport]:
            return run_claude(
                request,
                on_event,
                on_position=live.at,
                detach=live.detach,
                control=live.control,
                prestarted=prestarted,
                may_start=lambda: self.holds(batch.room),
                spares=self.spares,
            )

        try:
            report = await attempt(request, prestarted)
        except BaseException:
            if prestarted is not None:
                # Cancelled before the run took it (a no-op once it did): it goes too.
                await shielded(prestarted.cancel())
            raise
        if report.session_not_found and session is not None and live.answer is None:
            await self.notices.say(
                batch.room,
                f"Claude no longer has session `{session}`; continuing in a new session.",
                about=batch,
            )
            await self.store.set_session(batch.room, None)
            # The same run id, so the same run directory: the first try's journal goes,
            # and its registration (the registry's row, claude's pid) with it. Should the
            # second try not start (the room moved meanwhile), the new owner then finds a
            # run that never began, and runs its messages.
            self._remove_journal(live)
            first, live.registered = live.registered, None
            await shielded(self._unregister(run.id, first))
            live.control = RunControl()
            # The first try's result (zeroed: no session) says nothing of this one's cost.
            live.result = None
            report = await attempt(replace(request, session_id=None), None)
        return report

    async def _prepare(
        self, run: _Run, taken: Taken | None, state: _RoomState | None = None
    ) -> tuple[RunRequest, Prestarted | None] | RunReport:
        """The run's request, and the claude started for it if one was (a report instead
        when the run may not start: its prestart, if any, is given up then); ``state``:
        the room's session and overrides, being read."""
        batch = run.batch
        room = self.settings.room(batch.room)
        if room is None:
            await self._give_up(taken, "failed")
            return RunReport(RunStatus.FAILED, error="room not configured")
        prepared = await self._room_for_run(batch.room, room)
        if isinstance(prepared, _Refusal):
            # Recorded as a failed run: the room is told (once, for this batch), and
            # after a budget's refusal `!retry` runs the messages once it has reset.
            await self._give_up(taken, "failed")
            if prepared.budget is not None:
                self.metrics.budget_refusals.labels(prepared.budget).inc()
                log.info("run not started: the %s's daily budget is spent", prepared.budget)
            return RunReport(RunStatus.FAILED, error=prepared.error)
        room = prepared
        log.info("run started with %d message(s)", len(batch.messages))
        files: list[FetchedFile] = []
        images: list[PromptImage] = []
        if self.inbox is not None:
            limits = FileLimits(room.max_file_bytes, room.max_message_files_bytes)
            files = await self.inbox.fetch(run.id, batch, room.cwd, limits)
            # Base64 grows by a third; the line must stay well under the runner's limit.
            budget = self.settings.runner.max_line_bytes // 2 * 3 // 4
            files, images = await shown_images(room.cwd, files, budget)
        prompt = build_prompt(batch, files)
        request = await self._request(batch.room, room, run.id, prompt, state)
        request = replace(request, images=tuple(images))
        if request.fork_session:
            # Used up by the run that forks (not by a prestart, which may be given up).
            await self._forking(batch.room)
        prestarted = await taken.prestarted(request) if taken is not None else None
        return request, prestarted

    async def prestart_request(self, key: RoomKey, run_id: RunId) -> RunRequest | None:
        """What a run of ``key`` would start with now, its prompt still unknown; None
        when no run of it would start (not configured, over budget, no worktree)."""
        room = self.settings.room(key)
        if room is None:
            return None
        prepared = await self._room_for_run(key, room)
        if isinstance(prepared, _Refusal):
            return None  # the run will say why
        return await self._request(key, prepared, run_id, "")

    async def _room_for_run(self, key: RoomKey, room: RoomSettings) -> RoomSettings | _Refusal:
        """``room``'s settings for a run of ``key`` now (in its worktree, made if need be),
        or why no run of it may start."""
        refused = await Budgets(self.settings, self.store, self.wall_clock).refusal(key)
        if refused is not None:
            return _Refusal(refused[1], budget=refused[0])
        try:
            return await self.worktrees.settings_for(key, room)
        except WorktreeError as problem:
            return _Refusal(str(problem))

    async def _request(
        self,
        key: RoomKey,
        room: RoomSettings,
        run_id: RunId,
        prompt: str,
        state: _RoomState | None = None,
    ) -> RunRequest:
        # Reads, before the spawn: nothing else stands in front of claude (but the
        # session's transcript, where another replica ran the conversation last).
        # Tried again while the database is briefly away (a restart): the start
        # is recorded, and failing now would fail messages no claude has seen.
        # ``state``: the first try, begun already.
        for delay in (*self.store_retry_delays_s, None):
            try:
                reading, state = state or self.store.room_state(key), None
                session, overrides = await reading
                break
            except StoreError:
                if delay is None:
                    raise
                log.warning("could not read the room's session; trying again in %gs", delay)
            await asyncio.sleep(delay)
        if session is not None:
            await self._restore_transcript(key, room, session)
        return run_request(self.settings, room, run_id, prompt, session, overrides)

    async def _forking(self, key: RoomKey) -> None:
        """``!fork`` is used up by the run that forks: the run after it goes on in the fork."""
        try:
            await self.store.set_room_fork(key, False)
        except StoreError:
            log.warning("could not clear the room's !fork; its next run forks again", exc_info=True)

    async def _restore_transcript(
        self, key: RoomKey, room: RoomSettings, session: SessionId
    ) -> None:
        """Bring the session's transcript from the database if this host lacks it."""
        if self.transcripts is None:
            return
        config_dir = self.transcripts.config_dir(room.env, room.cwd)
        if config_dir is None:
            log.warning("no HOME or CLAUDE_CONFIG_DIR for claude: its session is not restored")
            return
        try:
            await self.transcripts.restore_before(key, session, config_dir)
        except Exception:
            # claude then finds no session and the run goes on in a new one (see _drive).
            log.warning("could not restore the transcript of session %s", session, exc_info=True)

    async def _save_transcript(self, run: _Run, live: _Live) -> None:
        """Store the run's session transcript if the session is now the conversation's."""
        room = self.settings.room(run.batch.room)
        if self.transcripts is None or live.init is None or room is None:
            return
        session = live.init.session_id
        try:
            # What the end recorded decides (a !reset, a lost session, a failed write).
            if await self.store.get_session(run.batch.room) != session:
                return
            config_dir = self.transcripts.config_dir(room.env, Path(live.init.cwd))
            if config_dir is None:
                log.warning("no HOME or CLAUDE_CONFIG_DIR for claude: its session is not saved")
                return
            async with asyncio.timeout(TRANSCRIPT_SAVE_TIMEOUT_S):
                await self.transcripts.save_after(run.batch.room, session, config_dir)
        except Exception:
            log.warning("could not save the transcript of session %s", session, exc_info=True)

    def _spawned(self, run: _Run, live: _Live, supervisor: LiveRun) -> None:
        """claude runs: only now the room is shown that it does, once the registry
        (which takes claude's pid too) can find the run again after a restart."""
        slot = live.dispatched.slot if live.dispatched is not None else None
        cluster = self.settings.cluster
        if cluster.enabled and cluster.max_concurrent_runs is not None:
            # The cluster cap counts runs waiting for a person: a slot lent would go to
            # a run that then waits for the cluster's, holding it, while the answered
            # run waits for it back (docs/live-runs.md, "Waiting runs and the run slots").
            slot = None
        self.live_runs.bind(run.batch.room, run.id, live.control, slot)
        live.supervisor = supervisor
        live.registered = asyncio.create_task(
            self._register(run.id, supervisor), name=f"register {run.id}"
        )
        if live.offsets is None:
            live.offsets = asyncio.create_task(
                self._keep_offsets(run.id, live), name=f"offsets {run.id}"
            )
        if live.opening is None:
            live.opening = asyncio.create_task(self._opening(run, live), name=f"opening {run.id}")
            live.pump = asyncio.create_task(run.progress.pump(), name=f"progress {run.id}")

    def _on_event(self, run: _Run, live: _Live) -> EventCallback:
        """What the run's events start; nothing here may hold up reading claude's output."""
        room = self.settings.room(run.batch.room)
        files = (
            # Where claude runs: a thread's worktree, if it has one (the tool's paths
            # are relative to it).
            self.file_posts.watch(run.id, run.batch, in_worktree(run.batch.room, room))
            if self.file_posts is not None and room is not None
            else None
        )

        last_file: asyncio.Task[None] | None = None

        async def in_order(
            earlier: asyncio.Task[None] | None, post: Coroutine[Any, Any, None]
        ) -> None:
            # Each post waits for the one before it: files reach the room in the order
            # claude sent them, whatever each copy takes.
            try:
                if earlier is not None:
                    await asyncio.wait([earlier])
            except BaseException:
                post.close()  # never started: nothing of it to clean up
                raise
            await post

        async def on_event(event: RunEvent) -> None:
            nonlocal last_file
            if files is not None and (post := files.see(event)) is not None:
                # Before the run's end is recorded: a file comes before the answer.
                last_file = asyncio.create_task(in_order(last_file, post), name=f"file {run.id}")
                live.before_end.append(last_file)
            match event:
                case Spawned(live=supervisor):
                    self._spawned(run, live, supervisor)
                case Init(session_id=sid):
                    live.init = event
                    self.live_runs.started(run.batch.room, run.id, sid)
                    log.debug("the run writes to session %s", sid)
                case ToolUse(name=name, input=tool_input):
                    self.live_runs.used(run.batch.room, run.id, event)
                    if live.position > live.shown:
                        # (A reattached run replays its journal: what the room saw is not
                        # shown again.)
                        run.progress.tool_used(name, tool_input)
                        self.live_runs.did(run.batch.room, run.id, run.progress.tools[-1])
                        live.shown = live.position
                        live.shown_moved.set()
                case PermissionAsked() if self.approvals is not None:
                    asking = asyncio.create_task(
                        self.approvals.ask(run.id, run.batch, event), name=f"ask {run.id}"
                    )
                    live.asking[event.request_id] = asking
                    live.beside(asking)
                case PermissionCancelled(request_id=request_id) if (
                    self.approvals is not None and not _stopping(live)
                ):
                    # claude no longer waits on it (an interrupt while it asked): left
                    # pending, it would be taken by the next `!approve` in place of the
                    # request claude asks next, and its answer would reach nobody.
                    # (A stop's interrupt withdraws it too: the run's end says why.)
                    live.beside(
                        asyncio.create_task(
                            self._withdraw(run, live.asking.get(request_id), request_id),
                            name=f"withdraw {run.id}",
                        )
                    )
                case UsageLimited():
                    live.limited = event
                case JournalUnwritable(error=error) if not live.journal_trouble:
                    live.journal_trouble = True
                    self.metrics.journal_unwritable.inc()
                    live.beside(
                        asyncio.create_task(
                            self.notices.say(
                                run.batch.room, _unwritable_text(error), about=run.batch
                            ),
                            name=f"journal {run.id}",
                        )
                    )
                case Result():
                    live.result = event
                    self._on_result(run, live, event)
                case _:
                    pass

        return on_event

    async def _withdraw(
        self, run: _Run, asking: asyncio.Task[None] | None, request_id: str
    ) -> None:
        """Record that claude withdrew a request, once the request itself was recorded."""
        if asking is not None:
            await asyncio.wait({asking})
        if self.approvals is not None:
            await self.approvals.withdrawn(run.batch.room, run.id, request_id)

    def _on_result(self, run: _Run, live: _Live, event: Result) -> None:
        """A turn's result: an earlier turn's answer, or the run's (the end rule held)."""
        control = live.control
        held, live.held = live.held, None
        if held is not None:
            self._turn_answered(run, live, *held)  # a later result came: an earlier turn's
        if (control.settled and live.position < control.history_end) or control.promised:
            # Replayed history (a reattach): a message steered in as claude printed this
            # may come after it in the journal; or a steered message is promised (being
            # recorded): sent, the next result tells; withdrawn, the run ends on this.
            live.held = (event, live.position)
        elif not (control.settled or control.closed):
            # An earlier turn's result: messages steered into the run came after it.
            self._turn_answered(run, live, event, live.position)
        elif not event.is_error and live.answer is None:
            # The answer exists: record it and hand it over now, while the runner reaps
            # claude. From here on this is the outcome, whatever comes next (a stop, a
            # lingering process, an exit status); see run_claude. claude's input is
            # closed at once, not after the record: a replica stalled in between (a
            # pause) would keep an answered claude alive past its lease, beside the
            # new owner's run of the conversation (the replicas' chaos test saw it).
            stages.stamp("result_read")
            live.final = True  # (before the runner closes claude's input: no steering)
            log.info("claude printed its answer")
            run.progress.close()
            answer = answer_report(event, live.init)
            live.answer = asyncio.create_task(
                self._conclude(run, live, answer), name=f"answer {run.id}"
            )
            live.concluding.set()
        else:
            live.final = True
            log.info("claude printed an error result")

    def _turn_answered(self, run: _Run, live: _Live, event: Result, position: int) -> None:
        """A success answers what the run had so far (not again after a reattach)."""
        if event.is_error or position <= live.shown:
            return
        live.shown = position
        live.shown_moved.set()
        live.before_end.append(
            asyncio.create_task(self._answer_turn(run, event.text), name=f"turn {run.id}")
        )

    def _steer_hook(
        self, run_id: RunId, live: _Live, generation: int
    ) -> Callable[[Batch, bool], bool]:
        """The dispatcher's steer hook for this run: the batch goes into claude's session
        (after an interrupt of the running turn, in ``interrupt`` mode), or, once the run
        takes no more input or after a ``!reset`` (``generation``: the room's when the
        run began), back to the dispatcher, which queues it (False): after a reset the
        messages start the new session, not the conversation the room asked to forget.

        Taken, the batch is promised to the run at once (the end rule waits for it)
        and written into claude only once it is recorded as the run's
        (:meth:`_steer_in`): a crash in between leaves it unsent, never sent and
        still pending (which would run it a second time after the restart)."""

        def steer(batch: Batch, interrupt: bool) -> bool:
            control = live.control
            if self._generations.get(batch.room, 0) != generation:
                return False
            # (A reattach takes nothing before its replay caught up: the run may have
            # taken its last input while no bridge was there.)
            if live.final or not control.accepting or control.replaying:
                return False
            if any(m.attachments for m in batch.messages):
                return False  # files are fetched as a run is prepared: a follow-up run
            prompt = build_prompt(batch)
            try:
                uid = control.reserve(prompt, steer_uuid(run_id, batch))
            except InputClosed:
                return False
            live.before_end.append(
                asyncio.create_task(
                    self._steer_in(run_id, live, batch, (prompt, uid), interrupt),
                    name=f"steer {run_id}",
                )
            )
            return True

        return steer

    async def _steer_in(
        self,
        run_id: RunId,
        live: _Live,
        batch: Batch,
        message: tuple[str, str],
        interrupt: bool,
    ) -> None:
        """Record the steered messages as the run's (retried), then write them into
        claude (``message``: the prompt and the uuid it was promised under). Should the
        record keep failing, they are not sent (sent, they would stay pending and a
        restart would run them again): the promise is withdrawn, the room told, and the
        messages, pending, run at the next start."""
        recorded = await self._written(
            lambda: self.store.steer_into_run(run_id, batch, self.wall_clock())
        )
        control = live.control
        prompt, uid = message
        if not recorded:
            log.error("could not record the messages steered into the run; not sent")
            control.withdraw(uid)
            which = "Your messages" if len(batch.messages) > 1 else "Your message"
            await self.notices.say(
                batch.room,
                f"{which} could not be added to the run: the database kept failing."
                " Kept, they run when chatbridge restarts.",
                about=batch,
            )
            return
        try:
            if interrupt:
                control.interrupt_now()
            control.send(prompt, uid)
        except InputClosed:
            # The run's input closed while the record was written (a stop, claude's
            # exit): the messages are the run's and share its outcome (a stop drops
            # them; a failure offers them to `!retry` with the run).
            log.info("the run took no more input; the steered message(s) were not sent")
        else:
            log.info("%d message(s) steered into the run", len(batch.messages))
        live.steered.append(batch)
        await self._cosmetic(
            "show the steered messages", self.replier.phase(batch, RunPhase.RUNNING)
        )

    async def _answer_turn(self, run: _Run, text: str) -> None:
        """An earlier turn's answer, through the outbox like the run's last one."""
        reply = in_conversation(
            run.batch,
            safe_text(text).strip() or "(Claude finished without a reply.)",
            ReplyKind.RESULT,
        )
        try:
            entries = await self.store.enqueue([reply], self.wall_clock())
        except StoreError:
            log.warning("could not record a turn's answer; sending it directly", exc_info=True)
            await self.outbox.send_unrecorded(reply, delivery_key())
            return
        self.outbox.submit(entries)

    async def _register(self, run_id: RunId, supervisor: LiveRun) -> bool:
        """Put the run into the registry of live runs (synced); whether it is there."""
        try:
            await self.store.register_live_run(supervisor, self.wall_clock())
        except StoreError:
            # The run goes on; only a restart during it cannot reattach (it is
            # then stopped and reported interrupted, as before runs outlived us).
            log.warning("could not register the run; a restart would interrupt it", exc_info=True)
            return False
        stages.stamp("registered")
        return True

    async def _keep_offsets(self, run_id: RunId, live: _Live) -> None:
        """Keep the registry's delivered offset up with what the room was shown (not synced)."""
        written = live.shown
        while True:
            await live.shown_moved.wait()
            live.shown_moved.clear()
            shown = live.shown
            if (
                live.registered is not None
                and await live.registered
                and shown > written
                and await self._note_shown(run_id, shown)
            ):
                written = shown
            await asyncio.sleep(OFFSET_WRITE_INTERVAL_S)

    async def _note_shown(self, run_id: RunId, offset: int) -> bool:
        """Record the room's progress through the run's journal; whether it was recorded
        (a failure costs only a repeat of that progress after a restart)."""
        try:
            await self.store.set_delivered_offset(run_id, offset)
        except StoreError:
            log.debug("could not record the run's delivered offset", exc_info=True)
            return False
        return True

    async def _leave(self, run: _Run, live: _Live) -> None:
        """At a detaching shutdown: the run goes on without us; its progress so far is noted."""
        self.live_runs.unbind(run.batch.room, run.id)
        if live.before_end:
            # Steered messages are the run's (else the next start runs them again), and
            # earlier turns' answers are in the outbox before their offset is noted.
            await asyncio.gather(*live.before_end, return_exceptions=True)
        await _wind_down(live)
        if live.shown >= 0:
            await self._note_shown(run.id, live.shown)
        # The next start posts a message of its own: this one says why it stopped.
        self._finish_later(run, LEFT_RUNNING)
        log.info("left the run to its supervisor; the next start reattaches it")

    def _reached_claude(self, run: _Run, live: _Live) -> bool:
        """Whether claude may have got the run's prompt: it was spawned for it (or a
        prestarted one was given it: ``Spawned`` comes right after), or a spawn got as far
        as the run's directory (which the new owner would see: bridge/runs/stale_runs.py)."""
        return live.supervisor is not None or run_dir_made(self.settings.runner.state_dir, run.id)

    async def _drop(self, run: _Run, live: _Live) -> None:
        """The run never began here and another replica runs its messages: nothing of
        its end is recorded, nor told, but nothing of it stays here either."""
        room = run.batch.room
        self.live_runs.unbind(room, run.id)
        run.progress.close()
        if live.before_end:
            # Steered messages recorded into the run go with it to the new owner.
            await asyncio.gather(*live.before_end, return_exceptions=True)
        await _wind_down(live)
        # A registration under way is over (_wind_down waited for it): undone.
        registered, live.registered = live.registered, None
        await self._unregister(run.id, registered)
        if _shown_running(live):
            # Shown running (typing, the phase): not any more.
            await self._cosmetic("clear typing", self.replier.typing(room, False))
            await self._cosmetic(
                "show the messages waiting", self.replier.phase(run.batch, RunPhase.RECEIVED)
            )
        for batch in live.steered:
            # Shown running as they were steered in: the new owner runs them too.
            await self._cosmetic(
                "show the messages waiting", self.replier.phase(batch, RunPhase.RECEIVED)
            )
        if self.approvals is not None:
            # A first try's requests (before its session was found lost) wait no more.
            ended = self.approvals.run_ended(room, run.id, "moved to another replica")
            await self._cosmetic("close the run's tool requests", ended)
        self._finish_later(run, MOVED)

    async def _unregister(self, run_id: RunId, registered: asyncio.Task[bool] | None) -> None:
        """Undo a try's registration (once it is over), unless it is known not written."""
        if registered is None:
            return
        await asyncio.wait({registered})
        if (
            not registered.cancelled()
            and registered.exception() is None
            and not registered.result()
        ):
            return  # it failed: nothing to undo
        if await self._written(lambda: self.store.unregister_live_run(run_id)):
            return
        # The next owner then sees a registered run: it stops it and reports it
        # interrupted (the messages are offered to `!retry`), as for a run that began.
        log.warning("could not take the run's first try out of the registry of live runs")

    async def _written(self, write: Callable[[], Awaitable[object]]) -> bool:
        """``write`` to the store, tried again after each of ``store_retry_delays_s`` while
        the store fails; whether it got through."""
        delays = iter(self.store_retry_delays_s)
        while True:
            try:
                await write()
            except StoreError:
                delay = next(delays, None)
                if delay is None:
                    return False
                await asyncio.sleep(delay)
            else:
                return True

    def _remove_journal(self, live: _Live, *, keep_dir: bool = False) -> None:
        if live.supervisor is not None:
            remove_run_dir(live.supervisor.run_dir, keep_dir=keep_dir)
            live.supervisor = None

    async def _opening(self, run: _Run, live: _Live) -> bool:
        """Show the room that claude works once it has for ``typing_after_s`` (the
        progress message follows in time), unless its answer or its end came first;
        whether it did."""
        if live.registered is not None:
            await live.registered  # "running" only once a restart would find the run
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.typing_after_s):
                await live.concluding.wait()
        if live.concluding.is_set():
            # Typing on and off around an answer already on its way: two requests
            # in front of it, and a flicker.
            return False
        await self.replier.phase(run.batch, RunPhase.RUNNING)
        if live.concluding.is_set():
            # The answer came while the phase was being shown (the end shows its own
            # phase): typing on now would come after it, then off.
            return False
        await self.replier.typing(run.batch.room, True)
        return True

    def _progress(self, batch: Batch, started: float | None = None) -> ProgressMessage:
        """The run's status message; ``started`` (wall clock) for a run begun before now."""
        elapsed = 0.0 if started is None else max(0.0, self.wall_clock() - started)

        async def post(text: str) -> ExternalMessageId | None:
            return await self.replier.send(in_conversation(batch, text, ReplyKind.PROGRESS))

        async def edit(message_id: ExternalMessageId, text: str) -> bool:
            return await self.replier.edit(batch.room, message_id, text)

        return ProgressMessage(
            post=post,
            edit=edit,
            clock=time.monotonic,
            min_interval_s=self.progress_interval_s,
            show_after_s=self.settings.progress.show_after_s,
            started_at=time.monotonic() - elapsed,
        )

    async def _finalize(self, run: _Run, live: _Live, report: RunReport) -> None:
        """Record the run's end with its reply unless its answer did already, then the cosmetics."""
        self.live_runs.unbind(run.batch.room, run.id)
        try:
            if live.answer is None:
                settled = await self._conclude(run, live, report)
            else:
                settled = await live.answer
                if report.status is not RunStatus.SUCCEEDED or report.exit_code != 0:
                    log.info(
                        "after its answer the run ended %s (exit %s); the answer stands",
                        report.status.value,
                        report.exit_code,
                    )
                report = replace(report, status=RunStatus.SUCCEEDED)
            room = self.settings.room(run.batch.room)
            if room is not None and room.run_figures:
                run.progress.figures = _figures(report)
            await self._cosmetics(run, live, report.status, settled)
            if self.approvals is not None and not live.lost:
                # A request still being recorded (claude asked as the run ended) is
                # cancelled too: cancelled before its record lands, it would stay
                # pending for !status and the next !approve (bounded: a store write
                # and a post).
                asking = [t for t in live.asking.values() if not t.done()]
                if asking:
                    await asyncio.wait(asking, timeout=self.cosmetic_timeout_s)
                ended = self.approvals.run_ended(run.batch.room, run.id, report.status.value)
                await self._cosmetic("close the run's tool requests", ended)
        finally:
            # Nothing the run started outlives it (after a failure above too).
            await _wind_down(live)
            # The run is over and the room was told, through the store or (when
            # the outcome could not be recorded) around it: the journal has
            # served. Were it kept, a restart would replay the answer again.
            # Unrecorded, the empty directory stays: it tells the next start
            # that the run began (bridge.runs.stale_runs), so its messages are not
            # run a second time as if they never had been.
            self._remove_journal(live, keep_dir=live.end_unrecorded)

    async def _conclude(
        self, run: _Run, live: _Live, report: RunReport
    ) -> Callable[[], Awaitable[None]]:
        """Record the outcome with its replies and hand them to the outbox; a wait for them."""
        batch = run.batch
        if live.registered is not None:
            # Begun at the spawn, so done long before claude answers: the outcome
            # takes the run out of the registry, which must not come after.
            await asyncio.wait({live.registered})
        if live.before_end:
            # Steered messages are the run's, earlier answers come first.
            await asyncio.gather(*live.before_end, return_exceptions=True)
        # The outcome exists: no status message is posted from now on.
        run.progress.close()
        report = replace(
            report, result_text=safe_text(report.result_text), error=safe_text(report.error)
        )
        replies = self._replies(run.id, batch, report)
        changed = await self._changes(live, batch.room)
        if changed is not None and replies:
            replies[0] = replace(replies[0], text=f"{replies[0].text}\n\n{summary_line(changed)}")
        # A usage limit: the room is told when it resets (and of the retry then).
        limits = self.limits if report.status is RunStatus.FAILED else None
        limited = usage_limit(live.limited, report.result_text) if limits else None
        if limits is not None and limited is not None:
            text = await limits.limited(run.id, batch, limited)
            replies = [in_conversation(batch, text, ReplyKind.NOTICE)]
        ended = self.wall_clock()
        stages.stamp("finishing")
        entries = await self._record_end(run, report, ended, replies)
        if entries is None:
            live.end_unrecorded = True
            entries = await self._record_replies_alone(replies)
        if limits is not None and limited is not None:
            limits.noted()
        stages.stamp("outcome_recorded")
        if run.progress.posting:
            # Posted straight to the transport, while the answer goes through the
            # outbox: waited for, or "Working…" could land below the answer.
            await self._cosmetic("post the progress message first", run.progress.posted())
        settled: Callable[[], Awaitable[None]]
        if not self.holds(batch.room):
            # This replica lost the conversation meanwhile (a pause past its lease).
            # Only the owner speaks for it: the end is recorded (the first report of a
            # run stands: the new owner's, if it reported first), and any reply recorded
            # here is the owner's to deliver (its recheck); nothing is shown from here.
            live.lost = True
            log.warning(
                "run %s ended after this replica lost %s; its owner speaks for it",
                run.id, batch.room,
            )  # fmt: skip
            settled = _nothing
        else:
            settled = self.outbox.submit(entries)
            if changed is not None and replies:
                await self._post_diff(run, changed)
        self.metrics.runs_finished.labels(report.status.value).inc()
        self.metrics.run_duration.observe(max(0.0, ended - run.started))
        if report.cost_usd:
            self.metrics.cost.inc(report.cost_usd)
            self.metrics.room_cost.labels(batch.room.transport, batch.room.room_id).inc(
                report.cost_usd
            )
        log.info("run ended: %s", report.status.value)
        return settled

    async def _baseline(self, cwd: Path) -> Snapshot | None:
        """The working directory before the run, if git says it in time: the run does not
        wait for its summary longer than its answer does."""
        try:
            async with asyncio.timeout(CHANGES_TIMEOUT_S):
                return await snapshot(cwd)
        except TimeoutError:
            log.warning("git took over %gs to read the working directory", CHANGES_TIMEOUT_S)
            return None

    async def _changes(self, live: _Live, key: RoomKey) -> Changes | None:
        """What the run changed in its git working directory; None if nothing (or not
        asked for, or git could not say in time: the answer does not wait longer)."""
        if live.baseline is None:
            return None
        room = self.settings.room(key)
        # Only a diff that may be attached is read whole: a bigger one only says so.
        limit = room.max_send_file_bytes if room is not None and room.send_files else 0
        try:
            async with asyncio.timeout(CHANGES_TIMEOUT_S):
                return await changes(live.baseline, max_patch_bytes=limit)
        except TimeoutError:
            log.warning("git took over %gs to say what the run changed", CHANGES_TIMEOUT_S)
            return None

    async def _post_diff(self, run: _Run, changed: Changes) -> None:
        """The whole diff, after the answer, within the room's file limits."""
        room = self.settings.room(run.batch.room)
        if self.file_posts is None or room is None or not room.send_files:
            return
        if changed.patch_over:
            await self.notices.say(
                run.batch.room,
                f"The run's diff is not attached: it is over the room's file limit"
                f" (`max_send_file_bytes`, {room.max_send_file_bytes} bytes).",
                about=run.batch,
            )
            return
        if not changed.patch:
            return
        await self.file_posts.post_text(
            run.id,
            run.batch,
            "changes",
            name=f"{run.id}.diff",
            text=changed.patch,
            comment="The run's changes.",
        )

    async def _cosmetics(
        self, run: _Run, live: _Live, status: RunStatus, settled: Callable[[], Awaitable[None]]
    ) -> None:
        """The end of the run as the room sees it beside the answer, after the answer."""
        if live.lost:
            # Not this replica's conversation any more: no reaction, typing or last
            # edit of the progress message from here.
            live.concluding.set()  # an opening still waiting shows nothing now
            if live.pump is not None:
                live.pump.cancel()
            await run.progress.abandon()
            return
        run.progress.close()
        live.concluding.set()  # an opening still waiting shows nothing now
        if live.pump is not None:
            live.pump.cancel()  # a post under way is finished by progress.finish
            await asyncio.wait({live.pump})
        if live.opening is not None:
            # Typing on before typing off.
            await self._cosmetic("show that the run started", live.opening)
        # The cosmetics come after the answer, never in front of it: typing off
        # too, whose request would slow the answer's on a busy homeserver.
        await self._cosmetic("have the answer delivered", settled())
        if _shown_running(live):
            await self._cosmetic("clear typing", self.replier.typing(run.batch.room, False))
        self._finish_later(run, _OUTCOME_WORDS[status])
        phase = _PHASES.get(status, RunPhase.FAILED)
        for batch in (run.batch, *live.steered):
            await self._cosmetic("show the outcome", self.replier.phase(batch, phase))

    def _finish_later(self, run: _Run, outcome: str) -> None:
        """The progress message's last edit, by a task of the executor's (see :meth:`drain`)."""
        finishing = asyncio.create_task(
            self._finish_progress(run.progress, outcome), name=f"finish progress {run.id}"
        )
        self._finishing.add(finishing)
        finishing.add_done_callback(self._finishing.discard)

    async def _finish_progress(self, progress: ProgressMessage, outcome: str) -> None:
        """The progress message's last edit, beside the room: it may wait for the edit budget."""
        try:
            async with asyncio.timeout(self.progress_finish_timeout_s):
                await progress.finish(outcome)
        except TimeoutError:
            log.warning(
                "gave up finishing the progress message after %gs",
                self.progress_finish_timeout_s,
            )
        except Exception:
            log.warning("could not finish the progress message", exc_info=True)
        finally:
            await progress.abandon()

    def _replies(self, run_id: RunId, batch: Batch, report: RunReport) -> list[Reply]:
        """What tells the room how the run ended: the answer, or why there is none."""
        room = self.settings.room(batch.room)
        if report.status is RunStatus.SUCCEEDED:
            text = report.result_text.strip() or "(Claude finished without a reply.)"
            return [in_conversation(batch, text, ReplyKind.RESULT)]
        if report.status is not RunStatus.STOPPED and room is not None:
            prefix = self.settings.commands.prefix
            text = failure_text(report, room, prefix, run_id)
            return [in_conversation(batch, text, ReplyKind.NOTICE)]
        return []

    async def _record_end(
        self, run: _Run, report: RunReport, ended: float, replies: list[Reply]
    ) -> list[OutboxEntry] | None:
        """Record the outcome and the replies together, retrying a failing store.

        If the outcome cannot be recorded, the replies alone are put into the
        outbox (a separate transaction), so the answer stays durable; if that
        fails too, they are sent directly, waiting out rate limits a few
        times. Either way the run stays marked running until the next start's
        sweep, whose notice says the end may have gone unrecorded.
        """
        delays = iter(self.store_retry_delays_s)
        try:
            async with asyncio.timeout(RECORD_TIMEOUT_S):
                while True:
                    try:
                        # The session is kept unless a !reset came during the run.
                        entries = await self.store.finish_run(
                            run.id,
                            report,
                            ended,
                            replies,
                            keep_session=self._generations.get(run.batch.room, 0) == run.generation,
                        )
                    except Exception:
                        # Not only StoreError: whatever fails here, the run
                        # must end with an outcome if the store can take one.
                        delay = next(delays, None)
                        if delay is None:
                            raise
                        log.warning(
                            "could not record the end of the run; trying again", exc_info=True
                        )
                    else:
                        return entries
                    await asyncio.sleep(delay)
        except Exception:
            log.exception("could not record the end of the run; recording its replies alone")
        return None

    async def _record_replies_alone(self, replies: list[Reply]) -> list[OutboxEntry]:
        """The outcome could not be recorded: keep the answer durable if the store allows."""
        if not replies:
            return []
        for delay in (*self.store_retry_delays_s, None):
            try:
                return await self.store.enqueue(replies, self.wall_clock())
            except Exception:
                if delay is None:
                    break
                log.warning("could not record the run's replies; trying again", exc_info=True)
            await asyncio.sleep(delay)
        log.error("could not record the run's replies either; sending them directly")
        for reply in replies:
            await self.outbox.send_unrecorded(reply, delivery_key())
        return []

    async def _cosmetic(self, what: str, step: Awaitable[Any]) -> None:
        """A step that must neither fail nor hold up the end of a run for long."""
        try:
            async with asyncio.timeout(self.cosmetic_timeout_s):
                await step
        except TimeoutError:
            log.info("gave up waiting to %s after %gs", what, self.cosmetic_timeout_s)
        except Exception:
            log.warning("could not %s", what, exc_info=True)


CHANGES_TIMEOUT_S = 10.0
"""How long the answer waits for git to say what the run changed."""


def _figures(report: RunReport) -> str:
    """``3 turns · $0.0123``: what the status message's last edit adds (unknown left out)."""
    parts = []
    if report.num_turns:
        parts.append(f"{report.num_turns} turn{'s' if report.num_turns != 1 else ''}")
    if report.cost_usd is not None:
        parts.append(f"${report.cost_usd:.4f}")
    return " · ".join(parts)

"""Executes one batch: record the run, drive claude, report back, record the outcome.

The dispatcher calls :meth:`RunExecutor.execute` in a task it owns and
cancels that task to stop the run; the runner then leaves no process behind
and this module records the run as the dispatcher says it ended
(``DispatchedRun.end_reason``): stopped if the room asked for it
(``!stop``), otherwise interrupted (shutdown, a failing service), which
``!retry`` can run again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from bridge.config import RoomSettings, Settings
from bridge.core.aio import shielded
from bridge.core.model import (
    Batch,
    ExternalMessageId,
    ReplyKind,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
    SessionId,
)
from bridge.core.transport import RunPhase
from bridge.logs import log_context
from bridge.metrics import Metrics
from bridge.progress import ProgressMessage
from bridge.replies import Replier, in_conversation
from bridge.store.base import Store, StoreError
from dispatcher import DispatchedRun, EndReason
from runner import RunRequest, run_claude
from runner.events import Init, RunEvent, Spawned, ToolUse

log = logging.getLogger(__name__)

FINALIZE_TIMEOUT_S = 30.0
"""How long recording and reporting a run's end may take before we give up on it."""


def new_run_id() -> RunId:
    return RunId(f"run-{secrets.token_hex(8)}")


def build_prompt(batch: Batch) -> str:
    """The batch's texts verbatim, in order; attributed when there are several."""
    if len(batch.messages) == 1:
        return batch.first.text
    return "\n\n".join(f"{m.sender} wrote:\n{m.text}" for m in batch.messages)


def run_request(
    settings: Settings, room: RoomSettings, run_id: RunId, prompt: str, session: SessionId | None
) -> RunRequest:
    return RunRequest(
        run_id=run_id,
        claude_bin=settings.runner.claude_bin,
        cwd=room.cwd,
        prompt=prompt,
        session_id=session,
        model=room.model,
        permission_mode=room.permission_mode,
        allowed_tools=room.allowed_tools,
        disallowed_tools=room.disallowed_tools,
        append_system_prompt=room.append_system_prompt,
        max_turns=room.max_turns,
        env=room.env,
        extra_args=room.extra_args,
        run_timeout_s=room.run_timeout_s,
        idle_timeout_s=room.idle_timeout_s,
        stop_grace_s=settings.runner.stop_grace_s,
        max_line_bytes=settings.runner.max_line_bytes,
        cgroup_parent=settings.runner.cgroup_root,
        memory_max=room.memory_max,
        pids_max=room.pids_max,
    )


_OUTCOME_WORDS: dict[RunStatus, str] = {
    RunStatus.SUCCEEDED: "Done",
    RunStatus.FAILED: "Failed",
    RunStatus.STOPPED: "Stopped",
    RunStatus.TIMED_OUT: "Timed out",
    RunStatus.STALLED: "Stalled",
    RunStatus.INTERRUPTED: "Interrupted",
}

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


def _cancelled_status(dispatched: DispatchedRun) -> RunStatus:
    """How a cancelled run is recorded: as the dispatcher says it ended."""
    if dispatched.end_reason is EndReason.STOPPED:
        return RunStatus.STOPPED
    return RunStatus.INTERRUPTED  # shutdown, or a failing service


@dataclass(frozen=True, slots=True)
class _Run:
    """What finishing a run needs to know about it."""

    id: RunId
    batch: Batch
    started: float
    generation: int
    """The room's ``!reset`` generation when the run started."""
    progress: ProgressMessage


@dataclass(slots=True)
class RunExecutor:
    """Runs batches for the dispatcher: one :meth:`execute` call per run."""

    settings: Settings
    store: Store
    replier: Replier
    metrics: Metrics
    wall_clock: Callable[[], float] = time.time
    progress_interval_s: float = 2.0
    _generations: dict[RoomKey, int] = field(default_factory=dict)
    """Bumped by ``!reset``: a run that began before keeps its session to itself."""

    async def reset_session(self, room: RoomKey) -> None:
        """Forget the room's Claude session, also for the run active now."""
        self._generations[room] = self._generations.get(room, 0) + 1
        await self.store.set_session(room, None)

    async def execute(self, dispatched: DispatchedRun) -> None:
        """The dispatcher's ``execute``: it never calls this while shutting down."""
        run_id = new_run_id()
        with log_context(room=dispatched.batch.room, run=run_id):
            await self._execute(run_id, dispatched)

    async def _execute(self, run_id: RunId, dispatched: DispatchedRun) -> None:
        batch = dispatched.batch
        started = self.wall_clock()
        generation = self._generations.get(batch.room, 0)
        try:
            await self.store.start_run(run_id, batch, started)
        except asyncio.CancelledError:
            await self._settle(self._cancelled_at_start(run_id, dispatched))
            raise
        except StoreError:
            # Nothing was recorded: the messages are still pending and run
            # again after a restart.
            log.exception("could not record the start of a run")
            await self.replier.say(
                batch.room, "Could not start the run: the database failed.", about=batch
            )
            return
        self.metrics.runs_started.inc()
        if len(batch.messages) > 1:
            self.metrics.coalesced.inc(len(batch.messages))
        progress = self._progress(batch)
        run = _Run(run_id, batch, started, generation, progress)
        try:
            report = await self._drive(run_id, batch, progress)
        except asyncio.CancelledError:
            status = _cancelled_status(dispatched)
            # The runner has already killed the process tree; record and report
            # the end even if we are cancelled again meanwhile.
            report = RunReport(status)
            await self._settle(self._finalize(run, report))
            raise
        except Exception as exc:
            log.exception("the run failed inside chatbridge")
            report = RunReport(
                RunStatus.FAILED, error=f"internal error ({type(exc).__name__}); see the log"
            )
        # A !stop landing while the end is reported must not cut the answer off.
        await self._settle(self._finalize(run, report))

    async def _settle(self, work: Coroutine[Any, Any, None]) -> None:
        """Finish ``work`` whatever happens to this task, within a bound."""
        try:
            await shielded(asyncio.wait_for(work, FINALIZE_TIMEOUT_S))
        except TimeoutError:
            log.warning("recording the end of the run took over %gs", FINALIZE_TIMEOUT_S)

    async def _cancelled_at_start(self, run_id: RunId, dispatched: DispatchedRun) -> None:
        batch = dispatched.batch
        status = _cancelled_status(dispatched)
        if await self.store.get_run(run_id) is not None:
            await self.store.finish_run(run_id, RunReport(status), self.wall_clock())
        elif status is RunStatus.STOPPED:
            await self.store.mark_dropped(batch.ids, None, self.wall_clock())
        # Interrupted and not recorded: the messages stay pending for the restart.

    async def _drive(self, run_id: RunId, batch: Batch, progress: ProgressMessage) -> RunReport:
        room = self.settings.room(batch.room)
        if room is None:
            return RunReport(RunStatus.FAILED, error="room not configured")
        log.info("run started with %d message(s)", len(batch.messages))
        await self.replier.phase(batch, RunPhase.RUNNING)
        await self.replier.typing(batch.room, True)
        await progress.start()
        pump = asyncio.create_task(progress.pump(), name=f"progress {run_id}")
        try:
            return await self._attempts(run_id, batch, room, progress)
        finally:
            pump.cancel()
            await asyncio.wait({pump})

    async def _attempts(
        self, run_id: RunId, batch: Batch, room: RoomSettings, progress: ProgressMessage
    ) -> RunReport:
        prompt = build_prompt(batch)
        session = await self.store.get_session(batch.room)

        async def on_event(event: RunEvent) -> None:
            match event:
                case Spawned(pid=pid):
                    await self.store.set_run_pid(run_id, pid)
                case Init(session_id=sid):
                    log.debug("the run writes to session %s", sid)
                case ToolUse(name=name, input=tool_input):
                    progress.tool_used(name, tool_input)
                case _:
                    pass

        report = await run_claude(
            run_request(self.settings, room, run_id, prompt, session), on_event
        )
        if report.session_not_found and session is not None:
            await self.replier.say(
                batch.room,
                f"Claude no longer has session `{session}`; continuing in a new session.",
                about=batch,
            )
            await self.store.set_session(batch.room, None)
            report = await run_claude(
                run_request(self.settings, room, run_id, prompt, None), on_event
            )
        return report

    def _progress(self, batch: Batch) -> ProgressMessage:
        async def post(text: str) -> ExternalMessageId | None:
            return await self.replier.send(in_conversation(batch, text, ReplyKind.PROGRESS))

        async def edit(message_id: ExternalMessageId, text: str) -> None:
            await self.replier.edit(batch.room, message_id, text)

        return ProgressMessage(
            post=post,
            edit=edit,
            clock=time.monotonic,
            min_interval_s=self.progress_interval_s,
        )

    async def _finalize(self, run: _Run, report: RunReport) -> None:
        """Record and report how the run ended; each step goes ahead if another fails."""
        batch = run.batch
        room_key = batch.room
        ended = self.wall_clock()
        finish = self.store.finish_run(run.id, report, ended)
        await self._best_effort("record the end of the run", finish)
        self.metrics.runs_finished.labels(report.status.value).inc()
        self.metrics.run_duration.observe(max(0.0, ended - run.started))
        if report.cost_usd:
            self.metrics.cost.inc(report.cost_usd)
        if report.session_id is not None and self._generations.get(room_key, 0) == run.generation:
            await self._best_effort(
                "keep the session", self.store.set_session(room_key, report.session_id)
            )
        log.info("run ended: %s", report.status.value)
        await self.replier.typing(room_key, False)
        await run.progress.finish(_OUTCOME_WORDS[report.status])
        await self.replier.phase(batch, _PHASES.get(report.status, RunPhase.FAILED))
        room = self.settings.room(room_key)
        if report.status is RunStatus.SUCCEEDED:
            text = report.result_text.strip() or "(Claude finished without a reply.)"
            await self.replier.send(in_conversation(batch, text, ReplyKind.RESULT))
        elif report.status is not RunStatus.STOPPED and room is not None:
            prefix = self.settings.commands.prefix
            await self.replier.say(
                room_key, failure_text(report, room, prefix, run.id), about=batch
            )

    async def _best_effort(self, what: str, step: Awaitable[None]) -> None:
        try:
            await step
        except StoreError:
            log.exception("could not %s", what)

"""Executes one batch: record the run, drive claude, report back, record the outcome.

The dispatcher calls :meth:`RunExecutor.execute` in a task it owns and
cancels that task to stop the run; the runner then leaves no process behind
and this module records the run as stopped (or interrupted, at shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from bridge.config import RoomSettings, Settings
from bridge.logs import log_context
from bridge.metrics import Metrics
from bridge.model import (
    Batch,
    ExternalMessageId,
    ReplyKind,
    RunId,
    RunReport,
    RunStatus,
    SessionId,
)
from bridge.progress import ProgressMessage
from bridge.replies import Replier, in_conversation
from bridge.store.base import Store
from runner import RunRequest, run_claude
from runner.events import Init, RunEvent, Spawned, ToolUse
from transports.base import RunPhase

log = logging.getLogger(__name__)

FINALIZE_TIMEOUT_S = 10.0
"""How long recording a stopped run may take before we give up on it."""


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


def failure_text(report: RunReport, room: RoomSettings) -> str:
    match report.status:
        case RunStatus.TIMED_OUT:
            return f"The run was stopped after its time limit of {room.run_timeout_s:g}s."
        case RunStatus.STALLED:
            return f"The run was stopped: claude printed nothing for {room.idle_timeout_s:g}s."
        case RunStatus.STOPPED:
            return "The run was stopped."
        case RunStatus.INTERRUPTED:
            return "The run was interrupted because chatbridge is shutting down."
        case _:
            return f"The run failed: {report.error or 'unknown error'}"


@dataclass(slots=True)
class RunExecutor:
    settings: Settings
    store: Store
    replier: Replier
    metrics: Metrics
    wall_clock: Callable[[], float] = time.time
    progress_interval_s: float = 2.0
    shutting_down: bool = False
    """Set at shutdown, so runs cancelled then are recorded as interrupted."""

    async def execute(self, batch: Batch) -> None:
        if self.shutting_down:
            # Start nothing new while stopping: the messages stay pending in the
            # store and run after the restart.
            return
        run_id = new_run_id()
        with log_context(room=batch.room, run=run_id):
            await self._execute(run_id, batch)

    async def _execute(self, run_id: RunId, batch: Batch) -> None:
        room = self.settings.room(batch.room)
        started = self.wall_clock()
        await self.store.start_run(run_id, batch, started)
        self.metrics.runs_started.inc()
        if len(batch.messages) > 1:
            self.metrics.coalesced.inc(len(batch.messages))
        if room is None:
            await self._finalize(
                run_id,
                batch,
                started,
                None,
                RunReport(RunStatus.FAILED, error="room not configured"),
            )
            return
        log.info("run started with %d message(s)", len(batch.messages))
        await self.replier.phase(batch, RunPhase.RUNNING)
        await self.replier.typing(batch.room, True)
        progress = self._progress(batch)
        await progress.start()
        try:
            async with asyncio.TaskGroup() as tg:
                pump = tg.create_task(progress.pump())
                try:
                    report = await self._attempts(run_id, batch, room, progress)
                finally:
                    pump.cancel()
        except asyncio.CancelledError:
            status = RunStatus.INTERRUPTED if self.shutting_down else RunStatus.STOPPED
            # The runner has already killed the process tree; record it even if
            # we are cancelled again meanwhile, within a bound.
            finalize = self._finalize(run_id, batch, started, progress, RunReport(status))
            await asyncio.shield(asyncio.wait_for(finalize, FINALIZE_TIMEOUT_S))
            raise
        await self._finalize(run_id, batch, started, progress, report)

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
                    log.debug("run %s writes to session %s", run_id, sid)
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

    async def _finalize(
        self,
        run_id: RunId,
        batch: Batch,
        started: float,
        progress: ProgressMessage | None,
        report: RunReport,
    ) -> None:
        room_key = batch.room
        ended = self.wall_clock()
        await self.store.finish_run(run_id, report, ended)
        self.metrics.runs_finished.labels(report.status.value).inc()
        self.metrics.run_duration.observe(max(0.0, ended - started))
        if report.cost_usd:
            self.metrics.cost.inc(report.cost_usd)
        if report.session_id is not None:
            await self.store.set_session(room_key, report.session_id)
        log.info("run ended: %s", report.status.value)
        await self.replier.typing(room_key, False)
        if progress is not None:
            await progress.finish(_OUTCOME_WORDS[report.status])
        await self.replier.phase(batch, _PHASES.get(report.status, RunPhase.FAILED))
        room = self.settings.room(room_key)
        if report.status is RunStatus.SUCCEEDED:
            text = report.result_text.strip() or "(Claude finished without a reply.)"
            await self.replier.send(in_conversation(batch, text, ReplyKind.RESULT))
        elif report.status is not RunStatus.STOPPED and room is not None:
            await self.replier.say(room_key, failure_text(report, room), about=batch)

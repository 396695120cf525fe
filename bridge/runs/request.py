"""A run's request: the room's settings for it, its prompt and files, its session.

:func:`run_request` builds what the runner starts claude with; :class:`RunRequests`
(the executor's, and the prestarts') checks the budgets and the worktree, fetches the
files, reads the room's session (its transcript restored from the database where another
replica ran it last) and says what a prestart would start with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bridge.config import RoomSettings, Settings
from bridge.core.model import RoomKey, RunId, RunReport, RunStatus, SessionId
from bridge.host.worktrees import WorktreeError, Worktrees
from bridge.metrics import Metrics
from bridge.runs.budget import Budgets
from bridge.runs.file_posts import send_file_rules
from bridge.runs.inbox import FetchedFile, FileLimits, Inbox, shown_images
from bridge.runs.prestarts import Taken
from bridge.runs.prompt import build_prompt
from bridge.runs.running import STORE_RETRY_DELAYS_S, RoomState, Run, give_up
from bridge.runs.transcripts import Transcripts
from bridge.store.base import RoomOverrides, Store, StoreError
from runner import Prestarted, PromptImage, RunRequest

# The executor's parts log under its name (its log is one story per run).
log = logging.getLogger("bridge.runs.executor").getChild("request")


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


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a run may not start now: its room is told ``error``."""

    error: str
    budget: str | None = None
    """The budget that refused it (``room`` or ``service``), if one did."""


@dataclass(slots=True)
class RunRequests:
    """Builds runs' requests: the executor's, with their files, and the prestarts'."""

    settings: Settings
    store: Store
    metrics: Metrics
    worktrees: Worktrees = field(default_factory=Worktrees)
    """Thread conversations' git worktrees (``worktree = true``)."""
    inbox: Inbox | None = None
    """Fetches the files shared with a batch into the run's inbox; None: files are only named."""
    transcripts: Transcripts | None = None
    """Restores a session's transcript from the database (docs/replicas-sessions.md)."""
    wall_clock: Callable[[], float] = time.time
    store_retry_delays_s: tuple[float, ...] = STORE_RETRY_DELAYS_S

    async def prepare(
        self, run: Run, taken: Taken | None, state: RoomState | None = None
    ) -> tuple[RunRequest, Prestarted | None] | RunReport:
        """The run's request, and the claude started for it if one was (a report instead
        when the run may not start: its prestart, if any, is given up then); ``state``:
        the room's session and overrides, being read."""
        batch = run.batch
        room = self.settings.room(batch.room)
        if room is None:
            await give_up(taken, "failed")
            return RunReport(RunStatus.FAILED, error="room not configured")
        prepared = await self.room_for_run(batch.room, room)
        if isinstance(prepared, Refusal):
            # Recorded as a failed run: the room is told (once, for this batch), and
            # after a budget's refusal `!retry` runs the messages once it has reset.
            await give_up(taken, "failed")
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
        prepared = await self.room_for_run(key, room)
        if isinstance(prepared, Refusal):
            return None  # the run will say why
        return await self._request(key, prepared, run_id, "")

    async def room_for_run(self, key: RoomKey, room: RoomSettings) -> RoomSettings | Refusal:
        """``room``'s settings for a run of ``key`` now (in its worktree, made if need be),
        or why no run of it may start."""
        refused = await Budgets(self.settings, self.store, self.wall_clock).refusal(key)
        if refused is not None:
            return Refusal(refused[1], budget=refused[0])
        try:
            return await self.worktrees.settings_for(key, room)
        except WorktreeError as problem:
            return Refusal(str(problem))

    async def _request(
        self,
        key: RoomKey,
        room: RoomSettings,
        run_id: RunId,
        prompt: str,
        state: RoomState | None = None,
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


def kept_transcripts(
    settings: Settings, store: Store, wall_clock: Callable[[], float] = time.time
) -> Transcripts | None:
    """Where sessions' transcripts are kept in the database, if they are (``[runner]
    transcripts_in_db``; replicas always keep them: the next run may be another's)."""
    runner = settings.runner
    if runner.transcripts_in_db or settings.cluster.enabled:
        return Transcripts(store, runner.transcript_max_bytes, wall_clock)
    return None

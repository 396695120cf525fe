"""How a run ends: one ending per run, as its lifecycle says (bridge/runs/lifecycle.py).

:class:`RunEndings` is the part of :class:`~bridge.runs.executor.RunExecutor` that
carries out a run's ending action: the outcome recorded once with its cost and its
replies (retried; the replies kept durable if the outcome cannot be), a run left to
its supervisor, a run dropped for another replica; and what every ending cleans up
(docs/live-runs.md, "A run's lifecycle").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from bridge.config import RoomSettings
from bridge.core import stages
from bridge.core.model import Batch, Reply, ReplyKind, RoomKey, RunId, RunReport, RunStatus
from bridge.core.text import safe_text
from bridge.core.transport import RunPhase
from bridge.live.approval_flow import ApprovalFlow
from bridge.live.registry import LiveRuns
from bridge.metrics import Metrics
from bridge.outbound.notices import Notices
from bridge.outbound.outbox import Outbox
from bridge.outbound.replies import in_conversation
from bridge.runs.changes import Changes, Snapshot, changes, snapshot, summary_line
from bridge.runs.cosmetics import LEFT_RUNNING, MOVED, RunCosmetics, run_figures
from bridge.runs.file_posts import FilePosts
from bridge.runs.lifecycle import Action, Drop, End, Leave, Lost, Unrecorded
from bridge.runs.prestarts import Prestarts
from bridge.runs.running import Live, Run, nothing, shown_running, wind_down, with_claude_figures
from bridge.runs.transcripts import Transcripts
from bridge.runs.usage import LimitResumes, usage_limit
from bridge.store.base import OutboxEntry, RunEnding, RunLifecycleStore, StoreError
from bridge.store.rules import delivery_key
from runner import remove_run_dir
from runner.events import Result

# The executor's parts log under its name (its log is one story per run).
log = logging.getLogger("bridge.runs.executor").getChild("ending")

RECORD_TIMEOUT_S = 60.0
"""Recording a run's end (with retries) gives up after this long: the room is freed."""


TRANSCRIPT_SAVE_TIMEOUT_S = 60.0
"""Saving a session's transcript to the database after a run gives up after this long."""


CHANGES_TIMEOUT_S = 10.0
"""How long the answer waits for git to say what the run changed."""


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


NOT_KEPT = frozenset({RunStatus.STOPPED, RunStatus.INTERRUPTED})
"""Ends after which no claude is kept warm for the room: a stop, a shutdown, a lost room."""


class RunEndings(RunCosmetics):
    """The endings of a run (a part of :class:`RunExecutor`; the fields it names are
    the executor's that it uses)."""

    store: RunLifecycleStore
    metrics: Metrics
    outbox: Outbox
    notices: Notices
    store_retry_delays_s: tuple[float, ...]
    live_runs: LiveRuns
    approvals: ApprovalFlow | None
    prestarts: Prestarts | None
    limits: LimitResumes | None
    file_posts: FilePosts | None
    holds: Callable[[RoomKey], bool]
    transcripts: Transcripts | None
    _generations: dict[RoomKey, int]

    async def _end(self, run: Run, live: Live, action: Action, report: RunReport | None) -> None:
        """Every ending of a run started here or reattached comes here, once (the
        lifecycle's ending action): an outcome is recorded with the cost claude reported
        (unknown, None, if it printed no result) and its answer or notice; a run left to
        its supervisor or to another replica records nothing here (its end is recorded
        where it goes on). ``report``: the drive's, when it was not cancelled."""
        match action:
            case Leave():
                await self._leave(run, live)  # the next start reattaches it
                return
            case Drop():
                # Nothing recorded (the new owner does), but nothing of it stays here
                # either: a retry in a new session may come after a first try that ran.
                log.warning(
                    "run %s %s: %s moved to another replica, which runs its messages",
                    run.id,
                    "not started"
                    if report is not None
                    else "cancelled before claude got the prompt",
                    run.batch.room,
                )
                await self._drop(run, live)
                return
            case End(cancelled=RunStatus() as status):
                # A stop interrupts claude's turn first: its session stays resumable, and
                # the interrupted turn's result says what it cost (added below). A run
                # that had printed its answer keeps it (the answer task records it).
                session = live.init.session_id if live.init is not None else None
                ending = RunReport(status, session_id=session)
            case End() if report is not None:
                ending = report
            case _:
                return
        held, live.held = live.held, None
        if held is not None and ending.status is not RunStatus.SUCCEEDED:
            # A result held back (a message was promised after it, or may have been sent
            # after it before a restart) that the run did not end on: an earlier turn's.
            self._turn_answered(run, live, *held)
        try:
            await self._finalize(run, live, with_claude_figures(ending, live.result), action.record)
        finally:
            # After the answer, before the room is free: the conversation's next run,
            # here or on another replica, resumes what this one left.
            await self._save_transcript(run, live)

    def _keep_warm(self, room: RoomKey, report: RunReport) -> None:
        """Start the room's next claude now (``prestart_keep_s``), after a run that ended
        on its own. Here its claude is gone (run_claude returns only then) and its
        outcome and session are recorded: the next one resumes that session."""
        if self.prestarts is None or report.status in NOT_KEPT:
            return  # a stop, or the run's end was not its own (shutdown, replica lost)
        if self.settings.room(room) is None or not self.holds(room):
            return  # nothing of the room runs here any more
        self.prestarts.keep_warm(room)

    async def _leave(self, run: Run, live: Live) -> None:
        """At a detaching shutdown: the run goes on without us; its progress so far is noted."""
        self.live_runs.unbind(run.batch.room, run.id)
        if live.before_end:
            # Steered messages are the run's (else the next start runs them again), and
            # earlier turns' answers are in the outbox before their offset is noted.
            await asyncio.gather(*live.before_end, return_exceptions=True)
        await wind_down(live)
        if live.shown >= 0:
            await self._note_shown(run.id, live.shown)
        # The next start posts a message of its own: this one says why it stopped.
        self._finish_later(run, LEFT_RUNNING)
        log.info("left the run to its supervisor; the next start reattaches it")

    async def _drop(self, run: Run, live: Live) -> None:
        """The run never began here and another replica runs its messages: nothing of
        its end is recorded, nor told, but nothing of it stays here either."""
        room = run.batch.room
        self.live_runs.unbind(room, run.id)
        run.progress.close()
        if live.before_end:
            # Steered messages recorded into the run go with it to the new owner.
            await asyncio.gather(*live.before_end, return_exceptions=True)
        await wind_down(live)
        # A registration under way is over (_wind_down waited for it): undone.
        registered, live.registered = live.registered, None
        await self._unregister(run.id, registered)
        if shown_running(live):
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

    def _remove_journal(self, live: Live, *, keep_dir: bool = False) -> None:
        if live.supervisor is not None:
            remove_run_dir(live.supervisor.run_dir, keep_dir=keep_dir)
            live.supervisor = None

    async def _finalize(self, run: Run, live: Live, report: RunReport, record: bool) -> None:
        """Record the run's end with its reply unless its answer did already (``record``
        False), then the cosmetics."""
        self.live_runs.unbind(run.batch.room, run.id)
        try:
            answer = live.answer
            if record or answer is None:
                settled = await self._conclude(run, live, report)
            else:
                settled = await answer
                if report.status is not RunStatus.SUCCEEDED or report.exit_code != 0:
                    log.info(
                        "after its answer the run ended %s (exit %s); the answer stands",
                        report.status.value,
                        report.exit_code,
                    )
                report = replace(report, status=RunStatus.SUCCEEDED)
            room = self.settings.room(run.batch.room)
            if room is not None and room.run_figures:
                run.progress.figures = run_figures(report)
            await self._cosmetics(run, live, report.status, settled)
            if self.approvals is not None and not live.state.lost:
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
            await wind_down(live)
            # The run is over and the room was told, through the store or (when
            # the outcome could not be recorded) around it: the journal has
            # served. Were it kept, a restart would replay the answer again.
            # Unrecorded, the empty directory stays: it tells the next start
            # that the run began (bridge.runs.stale_runs), so its messages are not
            # run a second time as if they never had been.
            self._remove_journal(live, keep_dir=live.state.unrecorded)

    async def _conclude(
        self, run: Run, live: Live, report: RunReport
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
            live.feed(Unrecorded())
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
            live.feed(Lost())
            log.warning(
                "run %s ended after this replica lost %s; its owner speaks for it",
                run.id, batch.room,
            )  # fmt: skip
            settled = nothing
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

    async def _changes(self, live: Live, key: RoomKey) -> Changes | None:
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

    async def _post_diff(self, run: Run, changed: Changes) -> None:
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
        self, run: Run, report: RunReport, ended: float, replies: list[Reply]
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
                        kept = self._generations.get(run.batch.room, 0) == run.generation
                        entries = await self.store.finish_run(
                            RunEnding(run.id, report, ended, replies, keep_session=kept)
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

    async def _answer_turn(self, run: Run, text: str) -> None:
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

    def _turn_answered(self, run: Run, live: Live, event: Result, position: int) -> None:
        """A success answers what the run had so far (not again after a reattach)."""
        if event.is_error or position <= live.shown:
            return
        live.shown = position
        live.shown_moved.set()
        live.before_end.append(
            asyncio.create_task(self._answer_turn(run, event.text), name=f"turn {run.id}")
        )

    async def _note_shown(self, run_id: RunId, offset: int) -> bool:
        """Record the room's progress through the run's journal; whether it was recorded
        (a failure costs only a repeat of that progress after a restart)."""
        try:
            await self.store.set_delivered_offset(run_id, offset)
        except StoreError:
            log.debug("could not record the run's delivered offset", exc_info=True)
            return False
        return True

    async def _save_transcript(self, run: Run, live: Live) -> None:
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

"""What a run's events start, while claude runs: nothing here holds up its output.

:class:`RunEvents` is the part of :class:`~bridge.runs.executor.RunExecutor` that turns
the runner's events into the registry's entry and offsets, tool uses shown, tool
requests asked, turns answered, the run's answer recorded at once, and messages
steered into the run, record first (docs/live-runs.md, "Messages during a run").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from bridge.core import stages
from bridge.core.model import Batch, LiveRun, RunId
from bridge.core.transport import RunPhase
from bridge.host.worktrees import in_worktree
from bridge.runs.ending import RunEndings
from bridge.runs.lifecycle import CONCLUDE, Answered, ClaudeSpawned, ErrorResult
from bridge.runs.prompt import build_prompt
from bridge.runs.running import Live, Run, being_stopped, steer_uuid
from bridge.store.base import StoreError
from runner import EventCallback, answer_report
from runner.control import InputClosed
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

# The executor's parts log under its name (its log is one story per run).
log = logging.getLogger("bridge.runs.executor").getChild("events")

OFFSET_WRITE_INTERVAL_S = 1.0
"""The registry's delivered offset is written at most this often per run (not synced)."""


def _unwritable_text(error: str) -> str:
    return (
        f"chatbridge cannot write to its state directory ({error}; most likely its disk is"
        " full). This run goes on: claude's output is kept in memory and the answer comes"
        " as usual. Tell the operator: the disk needs space."
    )


class RunEvents(RunEndings):
    """The events of a running run (a part of :class:`RunExecutor`; the fields it names are
    the executor's that it uses)."""

    def _spawned(self, run: Run, live: Live, supervisor: LiveRun) -> None:
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
        live.feed(ClaudeSpawned())
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

    def _on_event(self, run: Run, live: Live) -> EventCallback:
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
                    self.approvals is not None and not being_stopped(live)
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

    async def _withdraw(self, run: Run, asking: asyncio.Task[None] | None, request_id: str) -> None:
        """Record that claude withdrew a request, once the request itself was recorded."""
        if asking is not None:
            await asyncio.wait({asking})
        if self.approvals is not None:
            await self.approvals.withdrawn(run.batch.room, run.id, request_id)

    def _on_result(self, run: Run, live: Live, event: Result) -> None:
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
        elif not event.is_error and CONCLUDE in live.feed(Answered()):
            # The answer exists: record it and hand it over now, while the runner reaps
            # claude. From here on this is the outcome, whatever comes next (a stop, a
            # lingering process, an exit status); see run_claude. claude's input is
            # closed at once, not after the record: a replica stalled in between (a
            # pause) would keep an answered claude alive past its lease, beside the
            # new owner's run of the conversation (the replicas' chaos test saw it).
            # (Final now, before the runner closes claude's input: no steering.)
            stages.stamp("result_read")
            log.info("claude printed its answer")
            run.progress.close()
            answer = answer_report(event, live.init)
            live.answer = asyncio.create_task(
                self._conclude(run, live, answer), name=f"answer {run.id}"
            )
            live.concluding.set()
        else:
            live.feed(ErrorResult())
            log.info("claude printed an error result")

    def _steer_hook(
        self, run_id: RunId, live: Live, generation: int
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
            if live.state.final or not control.accepting or control.replaying:
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
        live: Live,
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

    async def _keep_offsets(self, run_id: RunId, live: Live) -> None:
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

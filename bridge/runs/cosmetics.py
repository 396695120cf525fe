"""How the room sees a run besides its answer: typing, the phase, the progress message.

:class:`RunCosmetics` is the part of :class:`~bridge.runs.executor.RunExecutor` that
shows a run running once it has lasted ``typing_after_s`` (not when its answer came
first) and shows its end after the answer, each step bounded so it neither fails nor
holds up the room (docs/operations.md, "Answers and rate limits").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bridge.config import Settings
from bridge.core.model import Batch, ExternalMessageId, ReplyKind, RunReport, RunStatus
from bridge.core.transport import RunPhase
from bridge.outbound.progress import ProgressMessage
from bridge.outbound.replies import Replier, in_conversation
from bridge.runs.running import Live, Run, shown_running

# The executor's parts log under its name (its log is one story per run).
log = logging.getLogger("bridge.runs.executor").getChild("cosmetics")

COSMETIC_TIMEOUT_S = 10.0
"""Each cosmetic update at a run's end, and the wait for the answer before them."""


TYPING_AFTER_S = 0.25
"""How long a run has claude before the room is shown it running (typing, the phase): an
answer that comes sooner (a claude started ahead answers within milliseconds) goes out
alone, with no typing on and off, two requests of the homeserver's, around it."""


PROGRESS_FINISH_TIMEOUT_S = 120.0
"""The progress message's last edit waits this long at most for the transport's edit budget
(Matrix's 6 edits a minute, slowed to an eighth by rate limits, give one in 80 s)."""


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


def run_figures(report: RunReport) -> str:
    """``3 turns · $0.0123``: what the status message's last edit adds (unknown left out)."""
    parts = []
    if report.num_turns:
        parts.append(f"{report.num_turns} turn{'s' if report.num_turns != 1 else ''}")
    if report.cost_usd is not None:
        parts.append(f"${report.cost_usd:.4f}")
    return " · ".join(parts)


class RunCosmetics:
    """The cosmetic steps of a run (a part of :class:`RunExecutor`; the fields it names are
    the executor's that it uses)."""

    settings: Settings
    replier: Replier
    wall_clock: Callable[[], float]
    progress_interval_s: float
    cosmetic_timeout_s: float
    typing_after_s: float
    progress_finish_timeout_s: float
    _finishing: set[asyncio.Task[None]]

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

    async def _opening(self, run: Run, live: Live) -> bool:
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

    async def _cosmetics(
        self, run: Run, live: Live, status: RunStatus, settled: Callable[[], Awaitable[None]]
    ) -> None:
        """The end of the run as the room sees it beside the answer, after the answer."""
        if live.state.lost:
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
        if shown_running(live):
            await self._cosmetic("clear typing", self.replier.typing(run.batch.room, False))
        self._finish_later(run, _OUTCOME_WORDS[status])
        phase = _PHASES.get(status, RunPhase.FAILED)
        for batch in (run.batch, *live.steered):
            await self._cosmetic("show the outcome", self.replier.phase(batch, phase))

    def _finish_later(self, run: Run, outcome: str) -> None:
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

    async def _cosmetic(self, what: str, step: Awaitable[Any]) -> None:
        """A step that must neither fail nor hold up the end of a run for long."""
        try:
            async with asyncio.timeout(self.cosmetic_timeout_s):
                await step
        except TimeoutError:
            log.info("gave up waiting to %s after %gs", what, self.cosmetic_timeout_s)
        except Exception:
            log.warning("could not %s", what, exc_info=True)

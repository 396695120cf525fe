"""Prestart: claude started (supervisor and all) before the prompt is known.

:func:`prestart` starts the supervisor and claude for a request with the run id the run will
use and sends ``initialize`` (``Prestarted.ready``); ``run_claude(..., prestarted=p)`` sends the
prompt into it, or starts cold if it does not match (:meth:`Prestarted.matches`: the whole
request but its prompt), died or never got ready. ``await p.cancel()`` leaves nothing: no
process, no run directory (docs/live-runs.md, "The runner's API" and "Prestart").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import replace
from pathlib import Path

from bridge.core.aio import shielded
from runner import supervision
from runner.command import build_argv, build_env, control_request
from runner.errors import StreamError
from runner.events import ControlAnswer
from runner.journal import JOURNAL
from runner.protocol import Malformed, parse_header
from runner.request import RunRequest
from runner.rundir import make_run_dir, remove_run_dir
from runner.spare import Spares
from runner.stream import LineFramer, parse_line
from runner.supervision import Record, RunLimits, Supervised

log = logging.getLogger(__name__)

READY_S = 30.0
"""How long claude may take to answer ``initialize`` (MCP servers start first)."""
INITIALIZE_ID = "cb-prestart-initialize"


class Prestarted:
    """A claude started for a request whose prompt is not known yet (see the module doc)."""

    def __init__(self, request: RunRequest, supervised: Supervised, run_dir: Path) -> None:
        self.request = replace(request, prompt="", images=())
        self.run_dir = run_dir
        self.live = supervised.live
        """Where its supervisor is reached (as in ``Spawned``)."""
        self._supervised: Supervised | None = supervised
        self._stopping: asyncio.Task[None] | None = None
        """The stop :meth:`cancel` began."""
        self._read: list[Record] = []
        """Records the wait for ``initialize``'s answer read: handed back to the run."""
        self.ready: asyncio.Task[bool] = asyncio.create_task(self._until_ready(supervised))
        """True once claude answered ``initialize`` (bounded by :data:`READY_S`)."""

    def matches(self, request: RunRequest) -> bool:
        """Whether ``request`` is the one this was started for, but for its prompt."""
        return replace(request, prompt="", images=()) == self.request

    async def _until_ready(self, supervised: Supervised) -> bool:
        framer = LineFramer(self.request.max_line_bytes)
        try:
            async with asyncio.timeout(READY_S):
                while (record := await supervised.read()) is not None:
                    self._read.append(record)
                    if record.kind == "exited":
                        return False
                    if record.kind == "out" and _answers_initialize(framer, record.payload):
                        return True
        except (TimeoutError, StreamError):
            pass
        return False

    async def take(self, request: RunRequest) -> Supervised | None:
        """The started run for ``request`` (its records read so far handed back), or None
        if it does not match, died or did not get ready: then :meth:`cancel` it."""
        supervised = self._supervised
        if supervised is None or not self.matches(request):
            return None
        # Not ``await self.ready``: a cancel meanwhile (the batch was dropped) cancels that
        # task, and awaiting it would cancel the run that waits here, which nobody stopped.
        await asyncio.wait({self.ready})
        if self._supervised is not supervised or self.ready.cancelled():
            return None  # cancelled meanwhile: the run starts cold
        if not self.ready.result() or supervised.claude_exit.done() or supervised.gone.done():
            return None
        # Nothing reads the journal between ``ready`` and now: a claude that died
        # meanwhile, or that its supervisor stopped (idle past ``idle_timeout_s`` through
        # a long debounce), is only known from the journal's file. Taken, the run would
        # report that end (failed, stalled) instead of starting cold.
        if _ended(self.run_dir, self._read[-1].end if self._read else 0):
            return None
        supervised.unread(self._read)
        self._supervised = None  # the run owns it now; cancel leaves it alone
        return supervised

    async def cancel(self) -> None:
        """Stop it and leave nothing (no-op once a run took it). Shielded.

        A second call waits for the first one's stop: a run that found its prestart
        cancelled meanwhile starts cold only once that stop is over, since both use
        the run's id (its marker, its directory).
        """
        supervised, self._supervised = self._supervised, None
        if supervised is not None:
            self._stopping = asyncio.create_task(self._stop(supervised))
        if self._stopping is not None:
            await shielded(_finished(self._stopping))

    async def _stop(self, supervised: Supervised) -> None:
        self.ready.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.ready
        try:
            supervised.stop()
            bound = self.request.stop_grace_s + supervision.SUPERVISOR_KILL_S
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(bound):
                    while await supervised.read() is not None:
                        pass  # to the journal's end: the supervisor's done
            if not supervised.contained:
                killed = await supervised.contain()
                log.warning("prestart %s: stopped without its supervisor (%d process(es))",
                            self.request.run_id, killed)  # fmt: skip
        finally:
            await supervised.close()
            remove_run_dir(self.run_dir)


async def _finished(task: asyncio.Task[None]) -> None:
    await task


_ENDING = frozenset({"stopping", "expired", "exited", "stdin_closed", "done"})
"""Records that say a run is over or being stopped: nothing to give a prompt to."""


def _ended(run_dir: Path, offset: int) -> bool:
    """Whether the run's journal says, past ``offset``, that it ended or is being stopped
    (or cannot be read: then it is not trusted with the prompt either)."""
    try:
        with (run_dir / JOURNAL).open("rb") as journal:
            journal.seek(offset)
            while (line := journal.readline()).endswith(b"\n"):
                fields = parse_header(line)
                if fields["t"] in _ENDING:
                    return True
                journal.seek(fields.get("n", 0), os.SEEK_CUR)
    except (OSError, Malformed):
        return True
    return False


def _answers_initialize(framer: LineFramer, payload: bytes) -> bool:
    for line in framer.feed(payload):
        for event in parse_line(line):
            if isinstance(event, ControlAnswer) and event.request_id == INITIALIZE_ID:
                return event.ok
    return False


async def prestart(request: RunRequest, spares: Spares | None = None) -> Prestarted:
    """Start the supervisor and claude for ``request`` (its prompt is not used) and send
    ``initialize``. Raises what starting raises (``OSError``, ``SpawnFailed``,
    ``Unanswered``, ``InvalidRequest``); cancelled, it leaves nothing."""
    argv = build_argv(request)
    env = build_env(request, os.environ)
    limits = RunLimits(request.cgroup_parent, request.memory_max, request.pids_max)
    run_dir = make_run_dir(request.state_dir, request.run_id)
    try:
        supervised = await supervision.start(
            request,
            argv,
            env=env,
            run_dir=run_dir,
            limits=limits,
            first=control_request(INITIALIZE_ID, "initialize"),
            spares=spares,
        )
    except BaseException:
        remove_run_dir(run_dir)
        raise
    return Prestarted(request, supervised, run_dir)

"""Speculative start: a room's claude started while its batch is still gathering.

The dispatcher decides when (:class:`~dispatcher.Prestarter`: a batch opened
in an idle room, within ``[runner] max_prestarts``, never in the way of a
run); this module does it. ``begin`` allots the run id the run will use and
starts the room's claude in a task (the room's session and settings are read
first, as for a run); the run takes it (:meth:`Prestarts.take`) when the
batch is flushed; ``cancel`` stops it and leaves nothing. A prestart that no
longer matches the run's request (the settings or the session changed:
wasted, ``changed``) or that failed or died (``failed``) is given up and the
run starts cold (:meth:`Taken.prestarted` decides, ``runner.run_claude``
also falls back for one that died since).

Metrics: prestarts used, wasted (by why) and the start-up time they saved:
the part of claude's start (spawn to ``initialize`` answered) that lay
before the batch was flushed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bridge.core.model import RoomKey, RunId
from bridge.metrics import Metrics
from runner import Prestarted, RunRequest, prestart

log = logging.getLogger(__name__)

RequestFor = Callable[[RoomKey, RunId], Awaitable[RunRequest | None]]
"""The request a run of the room would be started with now (its prompt empty)."""
Start = Callable[[RunRequest], Awaitable[Prestarted]]


@dataclass(slots=True)
class _Pending:
    run_id: RunId
    began: float
    task: asyncio.Task[Prestarted | None] = field(init=False)
    ready_at: float | None = None
    """When claude answered ``initialize`` (the clock's time), once it did."""


@dataclass(slots=True)
class Taken:
    """A prestart handed to the run beginning now: its run id, and claude once started."""

    run_id: RunId
    _pending: _Pending
    _prestarts: Prestarts
    _at: float
    """When the run took it (its batch was flushed)."""

    async def prestarted(self, request: RunRequest) -> Prestarted | None:
        """The prestarted claude for ``request`` (None: the run starts cold, same run id).

        One started for other settings or another session (a ``!model``, a
        ``!reset`` during the window), or that failed or never got ready, is
        counted wasted and stopped. Cancelled meanwhile, the prestart is
        stopped (the run never got it).
        """
        started = await self._started()
        metrics = self._prestarts.metrics
        why = "failed"
        if started is not None and not started.matches(request):
            why = "changed"
        elif started is not None and await self._ready(started):
            metrics.prestarts.labels("used", "").inc()
            # The part of its start that lay before the batch was flushed.
            ready_at = self._pending.ready_at
            done = self._at if ready_at is None else min(ready_at, self._at)
            metrics.prestart_saved.inc(max(0.0, done - self._pending.began))
            return started
        metrics.prestarts.labels("wasted", why).inc()
        if started is not None:
            await started.cancel()
        return None

    async def give_up(self, why: str) -> None:
        """The run never started: its prestart goes, counted wasted for ``why``."""
        started = await self._started()
        self._prestarts.metrics.prestarts.labels("wasted", why).inc()
        if started is not None:
            await started.cancel()

    async def _ready(self, started: Prestarted) -> bool:
        try:
            return await asyncio.shield(started.ready)
        except asyncio.CancelledError:
            await started.cancel()  # (shielded) the run never got it
            raise

    async def _started(self) -> Prestarted | None:
        try:
            return await asyncio.shield(self._pending.task)
        except asyncio.CancelledError:
            self._prestarts.stop_later(self._pending)
            raise
        except Exception:
            return None


@dataclass(slots=True)
class Prestarts:
    request_for: RequestFor
    metrics: Metrics
    new_run_id: Callable[[], RunId]
    start: Start = prestart
    clock: Callable[[], float] = time.monotonic
    _rooms: dict[RoomKey, _Pending] = field(default_factory=dict)
    _stopping: set[asyncio.Task[None]] = field(default_factory=set)

    # -- the dispatcher's Prestarter --

    def begin(self, room: RoomKey) -> None:
        if room in self._rooms:  # (the dispatcher pairs begin and cancel; be safe)
            return
        run_id = self.new_run_id()
        pending = _Pending(run_id, self.clock())
        pending.task = asyncio.create_task(self._start(room, pending), name=f"prestart {run_id}")
        self._rooms[room] = pending

    def cancel(self, room: RoomKey, why: str) -> None:
        pending = self._rooms.pop(room, None)
        if pending is None:
            return
        self.metrics.prestarts.labels("wasted", why).inc()
        log.info("prestart %s in %s given up: %s", pending.run_id, room, why)
        self.stop_later(pending)

    # -- the executor's side --

    def take(self, room: RoomKey) -> Taken | None:
        """The room's prestart, for the run beginning now (None: there is none)."""
        pending = self._rooms.pop(room, None)
        return None if pending is None else Taken(pending.run_id, pending, self, self.clock())

    async def close(self) -> None:
        """At shutdown: stop every prestart, wait for all of it."""
        for room in list(self._rooms):
            self.cancel(room, "shutdown")
        while self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)

    def stop_later(self, pending: _Pending) -> None:
        task = asyncio.create_task(_stop(pending.task), name=f"stop prestart {pending.run_id}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _start(self, room: RoomKey, pending: _Pending) -> Prestarted | None:
        request = await self.request_for(room, pending.run_id)
        if request is None:
            return None
        try:
            started = await self.start(request)
        except Exception as exc:  # the run starts cold and says what is wrong
            log.info("prestart %s in %s failed: %r", pending.run_id, room, exc)
            return None

        def ready(_: object) -> None:
            pending.ready_at = self.clock()

        started.ready.add_done_callback(ready)
        return started


async def _stop(task: asyncio.Task[Prestarted | None]) -> None:
    try:
        started = await task
    except BaseException:  # (cancelled or failed while starting: it cleaned up)
        return
    if started is not None:
        await started.cancel()

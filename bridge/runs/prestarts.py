"""Speculative start: a room's claude started while its batch is still gathering.

The dispatcher decides when (:class:`~dispatcher.Prestarter`); this module does it: ``begin``
allots the run id and starts the room's claude, the run takes it (:meth:`Prestarts.take`;
:meth:`Taken.prestarted` gives up one that no longer matches or died, and the run starts
cold), ``cancel`` stops it leaving nothing. :meth:`Prestarts.keep_warm` starts a room's next
claude when a run ends (``[runner] prestart_keep_s``); :meth:`Prestarts.let_go` stops it
(docs/live-runs.md, "Prestart (`bridge/runs/prestarts.py`)").
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
    expiry: asyncio.TimerHandle | None = None
    """While kept warm (nobody asked for it yet): when it is given up."""


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
            log.info("prestart %s used", self._pending.run_id)
            # The part of its start that lay before the batch was flushed.
            ready_at = self._pending.ready_at
            done = self._at if ready_at is None else min(ready_at, self._at)
            metrics.prestart_saved.inc(max(0.0, done - self._pending.began))
            return started
        metrics.prestarts.labels("wasted", why).inc()
        log.info("prestart %s given up: %s", self._pending.run_id, why)
        if started is not None:
            await started.cancel()
        return None

    async def give_up(self, why: str) -> None:
        """The run never started: its prestart goes, counted wasted for ``why``."""
        started = await self._started()
        self._prestarts.metrics.prestarts.labels("wasted", why).inc()
        log.info("prestart %s given up: %s", self._pending.run_id, why)
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
    keep_s: float = 0.0
    """How long a room's next claude is kept warm after a run (0: none is)."""
    keep_limit: int = 0
    """Claudes kept warm at once, across rooms."""
    _rooms: dict[RoomKey, _Pending] = field(default_factory=dict)
    _warm: dict[RoomKey, _Pending] = field(default_factory=dict)
    """The ones kept warm that nobody asked for yet, oldest first (also in ``_rooms``)."""
    _keeping: bool = True
    """False from the shutdown on: no claude is kept warm any more."""
    _stopping: set[asyncio.Task[None]] = field(default_factory=set)

    # -- the dispatcher's Prestarter --

    def begin(self, room: RoomKey) -> None:
        if room in self._rooms:
            # One kept warm: the dispatcher's now (no second claude), ended by its
            # cancel or taken by the run. (Otherwise the dispatcher pairs begin and
            # cancel; be safe.)
            self._unkeep(room)
            return
        self._launch(room)

    def cancel(self, room: RoomKey, why: str) -> None:
        pending = self._rooms.pop(room, None)
        if pending is None:
            return
        self._unkeep(room)
        self.metrics.prestarts.labels("wasted", why).inc()
        log.info("prestart %s in %s given up: %s", pending.run_id, room, why)
        self.stop_later(pending)

    # -- the executor's side --

    def take(self, room: RoomKey) -> Taken | None:
        """The room's prestart, for the run beginning now (None: there is none)."""
        pending = self._rooms.pop(room, None)
        if pending is None:
            return None
        self._unkeep(room)
        return Taken(pending.run_id, pending, self, self.clock())

    def keep_warm(self, room: RoomKey) -> None:
        """A run of ``room`` ended, its claude gone: start the room's next claude now,
        kept up to ``keep_s`` for its next run (see the module doc).

        Only once the run's claude has exited: the new one resumes the same session.
        """
        if self.keep_s <= 0 or self.keep_limit <= 0 or not self._keeping or room in self._rooms:
            return
        while len(self._warm) >= self.keep_limit:
            self.cancel(next(iter(self._warm)), "evicted")
        pending = self._launch(room)
        loop = asyncio.get_running_loop()
        pending.expiry = loop.call_later(self.keep_s, self._expire, room, pending)
        self._warm[room] = pending
        log.debug("prestart %s in %s kept warm for up to %gs", pending.run_id, room, self.keep_s)

    def let_go(self, room: RoomKey) -> None:
        """This replica lost ``room``: the claude kept warm for it goes too (the next
        owner resumes the session)."""
        if room in self._warm:
            self.cancel(room, "released")

    async def release(self, room: RoomKey) -> None:
        """As :meth:`let_go`, but returns once that claude is gone: before the lease
        goes, when the replica hands ``room`` over itself."""
        pending = self._warm.get(room)
        if pending is None:
            return
        self.cancel(room, "released")
        await _stop(pending.task)  # (a second stop waits for the first one's)

    async def stop_keeping(self) -> None:
        """The shutdown began: no run comes for the ones kept warm, none is kept any more.
        Returns once they are gone: a replica hands their conversations over next."""
        self._keeping = False
        warm = list(self._warm.values())
        for room in list(self._warm):
            self.cancel(room, "shutdown")
        for pending in warm:
            await _stop(pending.task)  # (a second stop waits for the first one's)

    async def close(self) -> None:
        """At shutdown: stop every prestart, wait for all of it."""
        self._keeping = False
        for room in list(self._rooms):
            self.cancel(room, "shutdown")
        while self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)

    def stop_later(self, pending: _Pending) -> None:
        task = asyncio.create_task(_stop(pending.task), name=f"stop prestart {pending.run_id}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _launch(self, room: RoomKey) -> _Pending:
        run_id = self.new_run_id()
        pending = _Pending(run_id, self.clock())
        pending.task = asyncio.create_task(self._start(room, pending), name=f"prestart {run_id}")
        self._rooms[room] = pending
        return pending

    def _unkeep(self, room: RoomKey) -> None:
        """``room``'s prestart is no longer kept warm: taken, adopted or cancelled."""
        pending = self._warm.pop(room, None)
        if pending is not None and pending.expiry is not None:
            pending.expiry.cancel()
            pending.expiry = None

    def _expire(self, room: RoomKey, pending: _Pending) -> None:
        if self._warm.get(room) is pending:
            self.cancel(room, "expired")

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

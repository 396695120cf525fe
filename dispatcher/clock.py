"""Time, injected: the dispatcher asks a clock for ``now`` and for timer callbacks.

:class:`MonotonicClock` is the real one. :class:`ManualClock` moves only when
a test (or the bench) calls :meth:`ManualClock.advance`, and runs due
callbacks synchronously inside that call, so the dispatcher's reaction to a
deadline is complete when ``advance`` returns: tests never sleep.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    """A scheduled callback that can be cancelled (``asyncio.TimerHandle`` is one)."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic seconds and callbacks at a given time."""

    def now(self) -> float:
        """Current time in monotonic seconds (arbitrary origin)."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Call ``callback`` once, from the event loop, at ``when`` or soon after."""
        ...


EARLY_S = 0.002
"""How much sooner than asked :class:`MonotonicClock` has the loop wake: the epoll
selector rounds its timeout up to a whole millisecond, so a timer left to the
loop fires 1 to 2 ms late. The rest is waited out by yielding to the loop."""


class _OnTime:
    """A loop timer armed early whose callback runs once ``when`` is reached."""

    __slots__ = ("_callback", "_handle", "_loop", "_when")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, when: float, callback: Callable[[], None]
    ) -> None:
        self._loop = loop
        self._when = when
        self._callback = callback
        early = max(0.0, when - EARLY_S - time.monotonic())
        self._handle: asyncio.Handle = loop.call_later(early, self._fire)

    def _fire(self) -> None:
        if time.monotonic() < self._when:
            # Yield, not sleep: the loop still serves I/O meanwhile (a poll with no timeout).
            self._handle = self._loop.call_soon(self._fire)
            return
        self._callback()

    def cancel(self) -> None:
        self._handle.cancel()


class MonotonicClock:
    """The real clock: ``time.monotonic`` and the running loop's timers.

    ``now`` works without a running loop (the service may submit recovered
    messages before the loop serves), and ``call_at`` schedules relative to
    ``now`` so it does not depend on the loop's own time origin. A callback
    runs at ``when``, not a millisecond or two after (see :data:`EARLY_S`).
    """

    def now(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return _OnTime(asyncio.get_running_loop(), when, callback)


class _ManualTimer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock for tests and benchmarks: time moves only in :meth:`advance`."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Schedule ``callback``; a time already reached fires at the next ``advance`` (even 0)."""
        timer = _ManualTimer(when, callback)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    @property
    def next_timer(self) -> float | None:
        """When the earliest pending callback is due, if any."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def advance(self, seconds: float) -> None:
        """Move time forward, running every callback due on the way, in time order.

        Each callback sees ``now()`` equal to its own due time (or the time
        already reached, if it was scheduled in the past), as with a real
        clock; callbacks it schedules within the range run too.
        """
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self.advance_to(self._now + seconds)

    def advance_to(self, target: float) -> None:
        """Like :meth:`advance`, to an absolute time (no-op if already past it)."""
        target = max(target, self._now)
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            timer.callback()
        self._now = target

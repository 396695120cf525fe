"""When a room's messages go to a run.

Debounces each room's messages into batches, runs at most one batch per
room at a time, and caps the runs across rooms. Messages arriving while a
run goes queue for the next run, or (per room, :class:`DuringRun`) steer the
running one. Runs may be prestarted (:class:`Prestarter`) while their batch
gathers, in run slots no room waits for. Sees only core types
(:mod:`bridge.core.model`); time comes from an injected :class:`Clock`.
"""

from dispatcher.clock import Clock, ManualClock, MonotonicClock, TimerHandle
from dispatcher.driver import DispatchedRun, Dispatcher, Execute, SteerHook
from dispatcher.limits import DispatchLimits
from dispatcher.policy import DuringRun, PrestartCancel, Prestarter
from dispatcher.status import EndReason, RoomStatus, StopResult

__all__ = [
    "Clock",
    "DispatchLimits",
    "DispatchedRun",
    "Dispatcher",
    "DuringRun",
    "EndReason",
    "Execute",
    "ManualClock",
    "MonotonicClock",
    "PrestartCancel",
    "Prestarter",
    "RoomStatus",
    "SteerHook",
    "StopResult",
    "TimerHandle",
]

"""When a room's messages go to a run.

Debounces each room's messages into batches, runs at most one batch per
room at a time, and caps the runs across rooms. Sees only core types
(:mod:`bridge.core.model`); time comes from an injected :class:`Clock`.
"""

from dispatcher.clock import Clock, ManualClock, MonotonicClock, TimerHandle
from dispatcher.driver import DispatchedRun, Dispatcher, Execute
from dispatcher.limits import DispatchLimits
from dispatcher.status import EndReason, RoomStatus, StopResult

__all__ = [
    "Clock",
    "DispatchLimits",
    "DispatchedRun",
    "Dispatcher",
    "EndReason",
    "Execute",
    "ManualClock",
    "MonotonicClock",
    "RoomStatus",
    "StopResult",
    "TimerHandle",
]

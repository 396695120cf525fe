"""The dispatcher's limits, as one immutable value."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DispatchLimits:
    """When a room's messages go to a run, and how many runs may be active.

    Times are in seconds (the clock's unit); the configuration speaks in
    milliseconds, see :meth:`from_ms`.
    """

    coalesce_s: float
    """Debounce window: a batch is flushed once no message arrived for this long."""
    max_wait_s: float
    """A batch is flushed at the latest this long after its first message."""
    max_batch: int
    """A batch is flushed as soon as it holds this many messages; no run gets more."""
    max_concurrent_runs: int
    """Runs active at once across all rooms."""

    def __post_init__(self) -> None:
        if self.coalesce_s < 0 or self.max_wait_s < 0:
            raise ValueError("coalesce and max wait must not be negative")
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if self.max_concurrent_runs < 1:
            raise ValueError("max_concurrent_runs must be at least 1")

    @classmethod
    def from_ms(
        cls, *, coalesce_ms: int, max_wait_ms: int, max_batch: int, max_concurrent_runs: int
    ) -> DispatchLimits:
        """Build limits from the configuration's ``[dispatcher]`` / ``[runner]`` values."""
        return cls(
            coalesce_s=coalesce_ms / 1000,
            max_wait_s=max_wait_ms / 1000,
            max_batch=max_batch,
            max_concurrent_runs=max_concurrent_runs,
        )

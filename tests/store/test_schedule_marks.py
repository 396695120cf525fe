"""The store's schedule marks: the latest firing each schedule dealt with, never going back."""

from __future__ import annotations

import asyncio

from tests.store.conftest import InspectableStore


async def test_no_marks_at_first(store: InspectableStore) -> None:
    assert await store.schedule_marks() == {}


async def test_marks_keep_the_latest_time_per_schedule(store: InspectableStore) -> None:
    await store.mark_schedule("daily", 1000.0)
    await store.mark_schedule("hourly", 50.0)
    await store.mark_schedule("daily", 2000.0)
    await store.mark_schedule("daily", 1500.0)  # a slower replica's older firing
    assert await store.schedule_marks() == {"daily": 2000.0, "hourly": 50.0}


async def test_concurrent_marks_end_at_the_latest(store: InspectableStore) -> None:
    times = [float(t) for t in range(1, 21)]
    await asyncio.gather(*(store.mark_schedule("race", t) for t in reversed(times)))
    assert await store.schedule_marks() == {"race": 20.0}

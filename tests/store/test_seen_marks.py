"""The store's seen marks: the newest message seen per room and thread, never going back."""

from __future__ import annotations

import asyncio

from bridge.core.model import ExternalMessageId, RoomId, RoomKey, TransportName
from tests.store.conftest import InspectableStore

SLACK = TransportName("slack")
CHANNEL = RoomKey(SLACK, RoomId("C1"))
THREAD = RoomKey(SLACK, RoomId("C1"), "1700000000.000100")
OTHER = RoomKey(TransportName("matrix"), RoomId("!r:hs"))


def ts(n: int) -> ExternalMessageId:
    return ExternalMessageId(f"1700000000.{n:06d}")


async def test_no_marks_at_first(store: InspectableStore) -> None:
    assert await store.seen_marks(SLACK) == {}


async def test_marks_keep_the_newest_id_per_room_and_thread(store: InspectableStore) -> None:
    await store.mark_seen({CHANNEL: ts(5), THREAD: ts(7), OTHER: ExternalMessageId("$e")}, 1.0)
    await store.mark_seen({CHANNEL: ts(9)}, 2.0)
    await store.mark_seen({CHANNEL: ts(6), THREAD: ts(8)}, 3.0)  # a slower replica's older
    assert await store.seen_marks(SLACK) == {CHANNEL: ts(9), THREAD: ts(8)}
    assert await store.seen_marks(TransportName("matrix")) == {OTHER: ExternalMessageId("$e")}


async def test_concurrent_marks_end_at_the_newest(store: InspectableStore) -> None:
    await asyncio.gather(
        *(store.mark_seen({CHANNEL: ts(n), THREAD: ts(n)}, float(n)) for n in range(20))
    )
    assert await store.seen_marks(SLACK) == {CHANNEL: ts(19), THREAD: ts(19)}


async def test_prune_forgets_threads_not_moved_since_and_keeps_rooms_own(
    store: InspectableStore,
) -> None:
    recent = RoomKey(SLACK, RoomId("C1"), "1700000000.000200")
    await store.mark_seen({CHANNEL: ts(1), THREAD: ts(2), recent: ts(3)}, 100.0)
    await store.mark_seen({recent: ts(4)}, 300.0)
    assert await store.prune(200.0) >= 1
    assert await store.seen_marks(SLACK) == {CHANNEL: ts(1), recent: ts(4)}

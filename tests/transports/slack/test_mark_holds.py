"""Seen marks of a channel whose catch-up is not finished are held back, for any order
of notes, holds and releases: what is written is exactly the newest mark noted while
not held, or held and released (never one a forgotten catch-up held)."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.model import RoomId, RoomKey, TransportName
from bridge.store.memory import MemoryStore
from transports.slack.marks import MarkSaver

SLACK = TransportName("slack")
CHANNELS = [RoomId("C1"), RoomId("C2")]
ROOMS = [RoomKey(SLACK, c, t) for c in CHANNELS for t in ("", "1700000000.000001")]

operations = st.lists(
    st.one_of(
        st.tuples(st.just("note"), st.sampled_from(ROOMS), st.integers(1, 99)),
        st.tuples(st.just("hold"), st.lists(st.sampled_from(CHANNELS), unique=True)),
        st.tuples(st.just("release"), st.sampled_from(CHANNELS)),
        st.tuples(st.just("forget")),
    ),
    max_size=30,
)


def ts(n: int) -> str:
    return f"1700000001.{n:06d}"


@settings(max_examples=300, deadline=None)
@given(operations)
def test_only_marks_noted_outside_a_hold_or_released_are_written(
    ops: list[tuple[Any, ...]],
) -> None:
    async def play() -> dict[RoomKey, str]:
        store = MemoryStore()
        saver = MarkSaver(store, wall=lambda: 1.0)
        task = asyncio.create_task(saver.run())
        for op in ops:
            match op:
                case ("note", room, n):
                    saver.note(room, ts(n))
                case ("hold", channels):
                    saver.hold(channels)
                case ("release", channel):
                    saver.release(channel)
                case ("forget",):
                    saver.forget_held()
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait([task])
        return dict(await store.seen_marks(SLACK))

    expected: dict[RoomKey, str] = {}
    held: dict[RoomId, dict[RoomKey, str]] = {}

    def put(marks: dict[RoomKey, str], room: RoomKey, mark: str) -> None:
        marks[room] = max(marks.get(room, mark), mark)

    for op in ops:
        match op:
            case ("note", room, n):
                put(held.get(room.room_id, expected), room, ts(n))
            case ("hold", channels):
                held = {c: {} for c in channels}
            case ("release", channel):
                for room, mark in held.pop(channel, {}).items():
                    put(expected, room, mark)
            case ("forget",):
                held = {}
    assert asyncio.run(play()) == expected

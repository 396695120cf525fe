"""Saving the sync position off the loop: writes coalesce, and stopping waits for the
write under way, then saves the last position noted."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from transports.matrix.position import PositionSaver
from transports.matrix.state import SyncPosition


class HeldPosition(SyncPosition):
    """A position file whose writes (in the saver's thread) wait until released."""

    def __init__(self, store_path: Path, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(store_path)
        self._loop = loop
        self.release = threading.Event()
        self.begun = asyncio.Event()
        self.wrote = asyncio.Event()
        self.written: list[str] = []

    def save(self, token: str) -> None:
        self._loop.call_soon_threadsafe(self.begun.set)
        if not self.release.wait(timeout=30):
            raise AssertionError("never released")
        super().save(token)
        self.written.append(token)
        self._loop.call_soon_threadsafe(self.wrote.set)


async def test_positions_noted_during_a_write_are_coalesced_newest_last(tmp_path: Path) -> None:
    position = HeldPosition(tmp_path, asyncio.get_running_loop())
    saver = PositionSaver(position)
    task = asyncio.create_task(saver.run())
    saver.note("s1")
    async with asyncio.timeout(10):
        await position.begun.wait()
    position.begun.clear()
    for token in ("s2", "s3", "s4"):
        saver.note(token)  # never waits for the disk
    position.release.set()
    async with asyncio.timeout(10):
        while position.written[-1:] != ["s4"]:
            await position.wrote.wait()
            position.wrote.clear()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert position.written == ["s1", "s4"]
    assert SyncPosition(tmp_path).load() == "s4"


async def test_stopping_waits_for_the_write_under_way_then_saves_the_last_noted(
    tmp_path: Path,
) -> None:
    position = HeldPosition(tmp_path, asyncio.get_running_loop())
    saver = PositionSaver(position)
    task = asyncio.create_task(saver.run())
    saver.note("s1")
    async with asyncio.timeout(10):
        await position.begun.wait()
    saver.note("s2")
    task.cancel()
    position.release.set()
    async with asyncio.timeout(10):
        await asyncio.gather(task, return_exceptions=True)
    # One write after the other, never two at once, and the newest kept.
    assert position.written == ["s1", "s2"]
    assert SyncPosition(tmp_path).load() == "s2"
    assert saver.writes == 2

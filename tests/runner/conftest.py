"""Fixtures for the runner tests: run ids, event recording, and a /proc check.

The /proc scan here is written independently of ``runner.process`` so the
tests do not trust the code they test to tell them that nothing survived.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from bridge.core.model import RunId
from runner import MARKER_ENV, RunEvent

E = TypeVar("E")


def pids_with_marker(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries ``marker``."""
    entry = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry_dir in Path("/proc").iterdir():
        if not entry_dir.name.isdigit():
            continue
        try:
            environ = (entry_dir / "environ").read_bytes()
        except OSError:
            continue
        if entry in environ.split(b"\0"):
            found.append(int(entry_dir.name))
    return found


def is_alive(pid: int) -> bool:
    """True unless ``pid`` is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def run_id() -> Iterator[RunId]:
    """A fresh run id; on teardown anything still carrying it is killed (safety net)."""
    rid = RunId(f"test-{uuid.uuid4()}")
    yield rid
    for pid in pids_with_marker(rid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Recorder:
    """An ``on_event`` callback that keeps events and lets a test wait for one type."""

    def __init__(self) -> None:
        self.events: list[RunEvent] = []
        self._seen: dict[type[RunEvent], asyncio.Event] = {}

    async def __call__(self, event: RunEvent) -> None:
        self.events.append(event)
        self._flag(type(event)).set()

    def _flag(self, kind: type[RunEvent]) -> asyncio.Event:
        return self._seen.setdefault(kind, asyncio.Event())

    async def wait_for(self, kind: type[RunEvent]) -> None:
        await self._flag(kind).wait()

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


async def exit_of(pidfd: int, within_s: float = 10) -> None:
    """Until the process behind ``pidfd`` exits (our child or not); TimeoutError after
    ``within_s``. The caller closes ``pidfd``."""
    readable = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(pidfd, readable.set)
    try:
        async with asyncio.timeout(within_s):
            await readable.wait()
    finally:
        loop.remove_reader(pidfd)


async def gone(pid: int, within_s: float) -> bool:
    """Whether process ``pid`` (ours or not) has exited within ``within_s`` (a zombie has)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        await exit_of(pidfd, within_s)
    except TimeoutError:
        return False
    finally:
        os.close(pidfd)
    return True

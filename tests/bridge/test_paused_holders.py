"""bridge.cluster.paused_holders against real processes holding a real SQLite lock."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from bridge.cluster.paused_holders import lock_holders, stop_paused_holders
from runner.proctree import is_stopped
from tests.bridge.paused_holders import stopped, writable


async def test_the_holder_of_a_lock_is_found_by_the_file_and_no_other(
    db: Path, tmp_path: Path, holder: asyncio.subprocess.Process
) -> None:
    other = tmp_path / "other.db"
    other.write_bytes(b"")
    assert holder.pid in lock_holders([db])
    assert os.getpid() not in lock_holders([db])
    assert holder.pid not in lock_holders([other])
    assert lock_holders([tmp_path / "missing.db"]) == set()


async def test_a_waiter_is_not_a_holder(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    path = tmp_path / "f"
    path.write_bytes(b"")
    inode = path.stat().st_ino
    locks.write_text(
        f"1: POSIX  ADVISORY  WRITE 4242 fe:00:{inode} 0 EOF\n"
        f"1: -> POSIX  ADVISORY  WRITE 4343 fe:00:{inode} 0 EOF\n"
        f"2: OFDLCK ADVISORY  READ  -1 fe:00:{inode} 0 EOF\n"
        "garbage\n"
    )
    assert lock_holders([path], locks) == {4242}


async def test_a_stopped_replica_holding_the_lock_is_killed_and_the_file_is_free(
    db: Path, holder: asyncio.subprocess.Process
) -> None:
    await stopped(holder)
    assert not writable(db)
    assert await stop_paused_holders([db], {holder.pid: time.time(), 1: 0.0}) == [holder.pid]
    assert await holder.wait() == -signal.SIGKILL
    assert writable(db)


async def test_a_running_holder_is_left_alone(db: Path, holder: asyncio.subprocess.Process) -> None:
    assert not is_stopped(holder.pid)
    assert await stop_paused_holders([db], {holder.pid: time.time()}) == []
    assert holder.returncode is None
    assert not writable(db)


async def test_a_stopped_holder_that_is_no_replica_is_left_alone(
    db: Path, holder: asyncio.subprocess.Process
) -> None:
    await stopped(holder)
    assert await stop_paused_holders([db], {os.getpid(): time.time()}) == []
    assert is_stopped(holder.pid)
    holder.send_signal(signal.SIGCONT)

"""A database and a process that holds its lock, paused and resumed by the test."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runner.proctree import is_stopped

HOLD = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("INSERT INTO t VALUES (1)")
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "store.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    conn.close()
    return path


@pytest.fixture
async def holder(db: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A process in a write transaction on ``db`` (so holding its lock)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLD, str(db), stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    assert await process.stdout.readline() == b"locked\n"
    yield process
    if process.returncode is None:
        process.kill()
        await process.wait()


def writable(db: Path) -> bool:
    conn = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()
    return True


async def stopped(process: asyncio.subprocess.Process) -> None:
    process.send_signal(signal.SIGSTOP)
    async with asyncio.timeout(10):
        while not is_stopped(process.pid):
            await asyncio.sleep(0.01)

"""Review of the store's transactions in threads (commit cc32058): defects found.

Each test names the defect it showed, fixed since.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from bridge.store.transactions import InThreads


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "t.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x INTEGER)")
    return path


@pytest.fixture
async def threads(database: Path) -> AsyncIterator[InThreads]:
    runner = InThreads(f"sqlite+aiosqlite:///{database}")
    try:
        yield runner
    finally:
        await runner.close()


class Gate:
    """Holds a thread at a point until the loop opens it; tells the loop it got there."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.reached = asyncio.Event()
        self._open = threading.Event()

    def wait_in_thread(self) -> None:
        self._loop.call_soon_threadsafe(self.reached.set)
        if not self._open.wait(timeout=30):
            raise TimeoutError("the gate was never opened")

    def open(self) -> None:
        self._open.set()


async def test_a_cancelled_transaction_runs_no_statement_after_the_one_under_way(
    threads: InThreads,
) -> None:
    """The module's docstring: "In a thread, the statement under way finishes first:
    milliseconds". In fact the whole body runs on: a cancelled ``prune`` (the
    housekeeping task, cancelled at every shutdown) runs each of its DELETEs over
    the whole database, then rolls them back, and the shutdown waits for all of it
    (through aiosqlite the cancellation landed at the next statement)."""
    gate = Gate()
    ran: list[str] = []

    def body(s: Session) -> None:
        s.execute(text("INSERT INTO t VALUES (1)"))
        gate.wait_in_thread()  # the caller is cancelled while the first statement is under way
        s.execute(text("INSERT INTO t VALUES (2)"))
        ran.append("second statement")
        s.execute(text("INSERT INTO t VALUES (3)"))
        ran.append("third statement")

    task = asyncio.create_task(threads.write(body))
    await gate.reached.wait()
    task.cancel()
    await asyncio.sleep(0)  # one turn: the task takes its cancellation (attempt cancelled)
    gate.open()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ran == []

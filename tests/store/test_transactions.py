"""Transactions in threads on a SQLite file: commits, cancellation, errors, closing."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event, text
from sqlalchemy.orm import Session

from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    Message,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.store.base import AuditAction, StoreError
from bridge.store.sql import SqlStore
from bridge.store.transactions import Body, InThreads

ROOM = RoomKey(TransportName("console"), RoomId("local"))


def message(external_id: str) -> InboundMessage:
    return InboundMessage(ROOM, UserId("me"), "hi", ExternalMessageId(external_id))


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


def insert(value: int) -> Body[int]:
    def body(s: Session) -> int:
        s.execute(text("INSERT INTO t VALUES (:x)"), {"x": value})
        return value

    return body


async def stored(threads: InThreads) -> list[int]:
    def body(s: Session) -> list[int]:
        return [x for (x,) in s.execute(text("SELECT x FROM t ORDER BY x"))]

    return await threads.read(body)


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


async def test_a_write_is_committed_when_it_returns_and_reads_see_it(
    threads: InThreads, database: Path
) -> None:
    assert await threads.write(insert(1)) == 1
    assert await stored(threads) == [1]
    with sqlite3.connect(database) as other:  # another connection: on disk, committed
        assert other.execute("SELECT x FROM t").fetchall() == [(1,)]


async def test_a_caller_cancelled_before_the_commit_writes_nothing(threads: InThreads) -> None:
    gate = Gate()

    def body(s: Session) -> None:
        s.execute(text("INSERT INTO t VALUES (7)"))
        gate.wait_in_thread()

    task = asyncio.create_task(threads.write(body))
    await gate.reached.wait()
    task.cancel()
    # One turn of the loop: the task takes its cancellation (the cancel request
    # alone does not stop the thread, which would otherwise race to its commit).
    await asyncio.sleep(0)
    gate.open()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await stored(threads) == []
    assert await threads.write(insert(8)) == 8
    assert await stored(threads) == [8]


@pytest.mark.parametrize("group", [False, True], ids=["alone", "group commit"])
async def test_a_caller_cancelled_once_the_commit_began_waits_for_it(
    threads: InThreads, group: bool
) -> None:
    """The commit is not cut short. A caller alone gets its cancellation (what it
    wrote is committed); a group commit's transaction reports its outcome."""
    gate = Gate()
    committing: list[str] = []
    event.listen(threads.engine, "commit", lambda _conn: gate.wait_in_thread())
    task = asyncio.create_task(
        threads.write(
            insert(3),
            committing=(lambda: committing.append(threading.current_thread().name))
            if group
            else None,
        )
    )
    await gate.reached.wait()
    task.cancel()
    gate.open()
    if group:
        assert await task == 3
        assert len(committing) == 1
        assert committing[0].startswith("chatbridge-store-writer")
    else:
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await stored(threads) == [3]


async def test_a_cancelled_transaction_runs_no_statement_after_the_one_under_way(
    threads: InThreads,
) -> None:
    """No statement of a cancelled body runs after the one under way (review: every
    statement ran, then rolled back; a cancelled ``prune`` at shutdown ran each of its
    DELETEs over the whole database first)."""
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


async def test_database_errors_become_store_errors_and_roll_back(threads: InThreads) -> None:
    def body(s: Session) -> None:
        s.execute(text("INSERT INTO t VALUES (1)"))
        s.execute(text("INSERT INTO missing VALUES (1)"))

    with pytest.raises(StoreError, match="no such table: missing"):
        await threads.write(body)
    assert await stored(threads) == []


async def test_reads_cannot_write(threads: InThreads) -> None:
    with pytest.raises(StoreError, match="attempt to write a readonly database"):
        await threads.read(insert(1))


async def test_a_read_is_not_held_up_by_a_write_in_progress(threads: InThreads) -> None:
    """Readers have threads and connections of their own (WAL: they read beside a writer)."""
    await threads.write(insert(1))
    gate = Gate()

    def held(s: Session) -> None:
        s.execute(text("INSERT INTO t VALUES (2)"))
        gate.wait_in_thread()

    writing = asyncio.create_task(threads.write(held))
    await gate.reached.wait()
    try:
        assert await stored(threads) == [1]  # the writer's row is not committed yet
    finally:
        gate.open()
    await writing
    assert await stored(threads) == [1, 2]


async def test_close_lets_the_transaction_in_flight_commit(database: Path) -> None:
    threads = InThreads(f"sqlite+aiosqlite:///{database}")
    gate = Gate()

    def held(s: Session) -> int:
        s.execute(text("INSERT INTO t VALUES (5)"))
        gate.wait_in_thread()
        return 5

    writing = asyncio.create_task(threads.write(held))
    await gate.reached.wait()
    closing = asyncio.create_task(threads.close())
    gate.open()
    await closing
    assert await writing == 5
    with sqlite3.connect(database) as other:
        assert other.execute("SELECT x FROM t").fetchall() == [(5,)]


# Hypothesis: a burst of accepts (some redeliveries) on a SQLite file, some
# callers cancelled after a few turns of the loop, wherever their transaction
# then is (queued, leading, in the writer thread, committing). Whatever the
# interleaving: no message is stored twice or lost by a caller that got it
# back, each stored message has exactly one "accepted" audit row, and the store
# goes on working.

accept_call = st.tuples(
    st.integers(min_value=0, max_value=5),  # which external id (repeats: redeliveries)
    st.none()  # never cancelled, or cancelled:
    | st.tuples(st.just("turn"), st.integers(min_value=0, max_value=6))  # after n loop turns
    | st.tuples(st.just("commit"), st.integers(min_value=1, max_value=4)),  # in the nth commit
)
Cancel = tuple[str, int] | None


async def accepts_cancelled(store: SqlStore, calls: list[tuple[int, Cancel]]) -> None:
    loop = asyncio.get_running_loop()
    tasks = [asyncio.create_task(store.accept(message(f"$m{which}"), 1.0)) for which, _ in calls]
    commits = 0

    @event.listens_for(store.writes_on, "commit")
    def _committing(_conn: object) -> None:
        # In the writer thread, between the decision to commit and the COMMIT:
        # the loop cancels its callers while the thread waits.
        nonlocal commits
        commits += 1
        chosen = [t for t, (_, c) in zip(tasks, calls, strict=True) if c == ("commit", commits)]
        if chosen:
            done = threading.Event()

            def cancel() -> None:
                for task in chosen:
                    task.cancel()
                done.set()

            loop.call_soon_threadsafe(cancel)
            assert done.wait(timeout=30)

    for turn in range(7):
        for task, (_, cancel_at) in zip(tasks, calls, strict=True):
            if cancel_at == ("turn", turn):
                task.cancel()
        await asyncio.sleep(0)
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    stored = {m.external_id: m for m in await store.pending_messages()}
    audited = [
        r.message_id
        for r in await store.audit_trail()
        if r.action is AuditAction.MESSAGE_ACCEPTED and r.message_id is not None
    ]
    assert sorted(audited) == sorted(m.id for m in stored.values())  # once each
    got_back = [o for o in outcomes if isinstance(o, Message)]
    for accepted in got_back:
        assert stored[accepted.external_id] == accepted
    assert len({m.external_id for m in got_back}) == len(got_back)  # one caller per message
    for outcome, (_, cancel_at) in zip(outcomes, calls, strict=True):
        assert (
            outcome is None
            or isinstance(outcome, Message)
            or (cancel_at is not None and isinstance(outcome, asyncio.CancelledError))
        ), outcome
    # Still working: a new message and a redelivery of every one.
    assert await store.accept(message("$new"), 2.0) is not None
    for which, _ in calls:
        assert await store.accept(message(f"$m{which}"), 2.0) is None or (
            ExternalMessageId(f"$m{which}") not in stored
        )


@settings(max_examples=60, deadline=None)
@given(st.lists(accept_call, min_size=1, max_size=10))
def test_cancelled_accepts_never_store_twice_nor_lose_an_answer(
    sqlite_template: Path, calls: list[tuple[int, Cancel]]
) -> None:
    async def run() -> None:
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "store.db"
            shutil.copy(sqlite_template, path)
            store = await SqlStore.open(f"sqlite+aiosqlite:///{path}", auto_migrate=False)
            try:
                await accepts_cancelled(store, calls)
            finally:
                await store.close()

    asyncio.run(run())

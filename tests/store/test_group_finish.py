"""Group commit of ``SqlStore.finish_run``: runs ending together share a transaction.

Each caller still gets exactly what a lone ``finish_run`` would have given
it, in call order: its own outbox entries, an error of its own for an
unknown run or a reply the database refuses, and, finishing a run twice,
the first call's entries. SQLite and PostgreSQL; a hypothesis test compares
random bursts with the memory store doing the same calls one by one.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    MessageState,
    Reply,
    RoomId,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
    SessionId,
    TransportName,
    UserId,
)
from bridge.store.base import DeliveryState, OutboxEntry, RunEnding, StoreError
from bridge.store.engine import create_engine
from bridge.store.memory import MemoryStore
from bridge.store.sql import FINISH_GROUP_LIMIT, SqlStore
from tests.store.conftest import SQL_BACKENDS, InspectableStore, open_backend
from tests.store.locks import write_begins, write_lock

ROOM = RoomKey(TransportName("console"), RoomId("local"))
ENDINGS = [s for s in RunStatus if s is not RunStatus.RUNNING]


@dataclass
class Counted:
    store: SqlStore
    commits: int = 0


@pytest.fixture
async def counted(backend: str) -> AsyncIterator[Counted]:
    """A store on its own engine that counts its writer's commits."""
    await (await open_backend(backend)).close()  # empties the shared PostgreSQL database
    engine = create_engine(backend)
    made = Counted(SqlStore(engine))

    @event.listens_for(made.store.writes_on, "commit")
    def _commit(conn: object) -> None:
        made.commits += 1

    try:
        yield made
    finally:
        await made.store.close()


async def started(store: InspectableStore, n: int) -> list[RunId]:
    """``n`` running runs of one message each."""
    runs = []
    for i in range(n):
        msg = await store.accept(
            InboundMessage(ROOM, UserId("u"), f"m{i}", ExternalMessageId(f"$m{i}")), 1.0
        )
        assert msg is not None
        run = RunId(f"run-{i}")
        await store.start_run(run, Batch(ROOM, (msg,)), 2.0)
        runs.append(run)
    return runs


def answer(run: RunId, text: str = "") -> Reply:
    return Reply(ROOM, text or f"answer of {run}")


SQL = pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)


@SQL
async def test_runs_ending_together_share_one_commit(counted: Counted) -> None:
    store = counted.store
    runs = await started(store, FINISH_GROUP_LIMIT + 5)
    before = counted.commits
    results = await asyncio.gather(
        *(
            store.finish_run(RunEnding(r, RunReport(RunStatus.SUCCEEDED), 3.0, [answer(r)]))
            for r in runs
        )
    )
    # The leader lets the loop turn once before taking the queue, so the calls
    # made together fill one full group; then the rest.
    assert counted.commits - before == 2
    for run, entries in zip(runs, results, strict=True):
        assert [(e.run_id, e.reply.text) for e in entries] == [(run, f"answer of {run}")]
    ids = [e.id for entries in results for e in entries]
    assert ids == sorted(ids)  # recorded in call order
    assert await store.undelivered() == [e for entries in results for e in entries]
    assert await store.running_runs() == []
    for run in runs:
        record = await store.get_run(run)
        assert record is not None
        assert record.status is RunStatus.SUCCEEDED
        assert (await store.message_states(record.message_ids)) == {
            m: MessageState.DONE for m in record.message_ids
        }


@SQL
async def test_an_unknown_run_fails_only_its_own_call(counted: Counted) -> None:
    store = counted.store
    a, b = await started(store, 2)
    results = await asyncio.gather(
        store.finish_run(RunEnding(a, RunReport(RunStatus.SUCCEEDED), 3.0, [answer(a)])),
        store.finish_run(
            RunEnding(RunId("nope"), RunReport(RunStatus.SUCCEEDED), 3.0, [answer(a)])
        ),
        store.finish_run(RunEnding(b, RunReport(RunStatus.FAILED), 3.0, [answer(b)])),
        return_exceptions=True,
    )
    first, unknown, last = results
    assert isinstance(unknown, StoreError)
    assert "no run nope" in str(unknown)
    assert isinstance(first, list)
    assert isinstance(last, list)
    assert await store.undelivered() == [*first, *last]


@SQL
async def test_delivery_records_made_together_share_one_commit(counted: Counted) -> None:
    """Many answers going out at once: their records (a part sent, the end) are
    grouped too; an unknown entry fails only its own call."""
    store = counted.store
    runs = await started(store, 12)
    ended = await asyncio.gather(
        *(
            store.finish_run(RunEnding(r, RunReport(RunStatus.SUCCEEDED), 3.0, [answer(r)]))
            for r in runs
        )
    )
    entries = [e for each in ended for e in each]
    before = counted.commits
    progress = await asyncio.gather(
        *(store.delivery_progress(e.id, 1) for e in entries),
        store.delivery_progress(987654, 1),
        return_exceptions=True,
    )
    assert counted.commits - before == 1
    *known, unknown = progress
    assert known == [None] * len(entries)
    assert isinstance(unknown, StoreError)
    assert "no outbox entry 987654" in str(unknown)
    before = counted.commits
    half = entries[: len(entries) // 2]
    await asyncio.gather(
        *(store.delivery_finished(e.id, DeliveryState.DELIVERED, 4.0) for e in half)
    )
    assert counted.commits - before == 1
    pending = await store.undelivered()
    assert [e.id for e in pending] == [e.id for e in entries[len(half) :]]
    assert all(e.parts_done == 1 for e in pending)


@SQL
async def test_a_refused_reply_fails_only_its_own_call(counted: Counted) -> None:
    """A lone surrogate cannot be encoded: the group goes again one by one."""
    store = counted.store
    a, bad, b = await started(store, 3)
    results = await asyncio.gather(
        store.finish_run(RunEnding(a, RunReport(RunStatus.SUCCEEDED), 3.0, [answer(a)])),
        store.finish_run(RunEnding(b, RunReport(RunStatus.SUCCEEDED), 3.0, [answer(b)])),
        store.finish_run(
            RunEnding(bad, RunReport(RunStatus.SUCCEEDED), 3.0, [answer(bad, "\ud800")])
        ),
        store.finish_run(RunEnding(a, RunReport(RunStatus.FAILED), 4.0)),
        return_exceptions=True,
    )
    first, second, refused, again = results
    assert isinstance(refused, StoreError)
    assert isinstance(first, list)
    assert isinstance(second, list)
    assert again == first  # the run had ended: its first call's entries
    assert await store.undelivered() == [*first, *second]
    still = await store.get_run(bad)
    assert still is not None
    assert still.status is RunStatus.RUNNING  # nothing of the refused call was kept


@SQL
async def test_finishing_twice_in_one_group_keeps_the_first_report(counted: Counted) -> None:
    store = counted.store
    [run] = await started(store, 1)
    _, first, second = await asyncio.gather(
        store.enqueue([answer(run, "leads alone")], 2.5),
        store.finish_run(RunEnding(run, RunReport(RunStatus.SUCCEEDED), 3.0, [answer(run)])),
        store.finish_run(RunEnding(run, RunReport(RunStatus.FAILED), 4.0, [answer(run, "late")])),
    )
    assert second == first
    record = await store.get_run(run)
    assert record is not None
    assert (record.status, record.ended_at) == (RunStatus.SUCCEEDED, 3.0)


@SQL
async def test_closing_fails_queued_finishes(counted: Counted, backend: str) -> None:
    """The queued call fails at once; the transaction under way ends first."""
    store = counted.store
    a, b = await started(store, 2)
    write_begun = write_begins(store, backend, "UPDATE messages")

    async with write_lock(backend) as lock:
        leader = asyncio.create_task(
            store.finish_run(RunEnding(a, RunReport(RunStatus.SUCCEEDED), 3.0))
        )
        await write_begun.wait()
        queued = asyncio.create_task(
            store.finish_run(RunEnding(b, RunReport(RunStatus.SUCCEEDED), 3.0))
        )
        closing = asyncio.create_task(store.close())
        with pytest.raises(StoreError, match="closed"):
            await queued
        await lock.release()
        assert await leader == []
        await closing
    reopened = await SqlStore.open(backend, auto_migrate=False)
    try:
        assert [r.id for r in await reopened.running_runs()] == [b]
    finally:
        await reopened.close()


# Session keeping against !reset (set_session(room, None)): the reset wins over
# any run's end that was not committed when the reset was made.


def with_session(run: RunId, session: str) -> RunReport:
    return RunReport(RunStatus.SUCCEEDED, session_id=SessionId(session), result_text="hi")


@SQL
async def test_a_reset_while_the_end_waits_for_its_group_is_not_undone(counted: Counted) -> None:
    store = counted.store
    [run] = await started(store, 1)
    await store.set_session(ROOM, SessionId("old-session"))
    finishing = asyncio.create_task(
        store.finish_run(
            RunEnding(run, with_session(run, "old-session"), 3.0, [answer(run)], keep_session=True)
        )
    )
    await asyncio.sleep(0)  # in finish_run: queued, the leader lets the loop turn once
    await store.set_session(ROOM, None)  # the !reset, answered
    await finishing
    assert await store.get_session(ROOM) is None


@SQL
async def test_a_reset_while_the_group_writes_commits_after_it(
    counted: Counted, backend: str
) -> None:
    """The group's transaction is under way (held at a lock) when the reset comes."""
    store = counted.store
    [run] = await started(store, 1)
    write_begun = write_begins(store, backend, "UPDATE messages")

    async with write_lock(backend) as lock:
        finishing = asyncio.create_task(
            store.finish_run(
                RunEnding(run, with_session(run, "s1"), 3.0, [answer(run)], keep_session=True)
            )
        )
        await write_begun.wait()
        resetting = asyncio.create_task(store.set_session(ROOM, None))
        # Nothing to wait on: a store that lets the reset commit now (PostgreSQL
        # does not lock ``rooms`` here) gets the time to, and fails below.
        await asyncio.sleep(0.05)
        await lock.release()
        await finishing
        await resetting
    assert await store.get_session(ROOM) is None


@SQL
async def test_a_session_set_before_the_call_is_replaced_by_the_runs(counted: Counted) -> None:
    store = counted.store
    first, second = await started(store, 2)
    await store.set_session(ROOM, None)  # a reset before the run's end was handed over
    await store.set_session(RoomKey(TransportName("slack"), RoomId("C1")), None)  # another room
    await store.finish_run(RunEnding(first, with_session(first, "s1"), 3.0, keep_session=True))
    assert await store.get_session(ROOM) == SessionId("s1")
    # keep_session=False (a reset during the run, seen by the executor) keeps nothing.
    await store.finish_run(RunEnding(second, with_session(second, "s2"), 4.0, keep_session=False))
    assert await store.get_session(ROOM) == SessionId("s1")


# Hypothesis: a burst of finish_run calls on SQLite agrees with the memory store
# doing them one after the other.

RUNS = 4
finish_call = st.tuples(
    st.integers(0, RUNS),  # RUNS: a run that does not exist
    st.sampled_from(ENDINGS),
    st.integers(0, 2),  # replies
)


def outcome(result: Sequence[OutboxEntry] | BaseException) -> object:
    """What a caller learns, without the ids and keys the stores number differently."""
    if isinstance(result, BaseException):
        return type(result).__name__
    return [(e.run_id, e.reply.text, e.state) for e in result]


async def burst(
    store: InspectableStore, calls: list[tuple[int, RunStatus, int]], *, together: bool
) -> list[object]:
    runs = await started(store, RUNS)
    ids = [*runs, RunId("missing")]

    async def finish(i: int, status: RunStatus, replies: int) -> list[OutboxEntry]:
        texts = [answer(ids[i], f"{status} {n}") for n in range(replies)]
        # Every call hands over a session of its own: the last one kept wins.
        report = RunReport(status, session_id=SessionId(f"session {i} {status} {replies}"))
        return await store.finish_run(RunEnding(ids[i], report, 3.0, texts, keep_session=True))

    if together:
        results = await asyncio.gather(*(finish(*c) for c in calls), return_exceptions=True)
    else:
        results = []
        for call in calls:
            try:
                results.append(await finish(*call))
            except StoreError as exc:
                results.append(exc)
    states = [await store.get_run(r) for r in runs]
    return [
        [outcome(r) for r in results],
        [None if s is None else (s.status, s.ended_at) for s in states],
        [(e.run_id, e.reply.text) for e in await store.undelivered()],
        await store.get_session(ROOM),
    ]


@settings(max_examples=25, deadline=None)
@given(st.lists(finish_call, min_size=1, max_size=12))
def test_a_burst_agrees_with_one_by_one(
    sqlite_template: Path, calls: list[tuple[int, RunStatus, int]]
) -> None:
    async def both() -> tuple[list[object], list[object]]:
        memory = await burst(MemoryStore(), calls, together=False)
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "store.db"
            shutil.copy(sqlite_template, path)
            sql = await SqlStore.open(f"sqlite+aiosqlite:///{path}", auto_migrate=False)
            try:
                return memory, await burst(sql, calls, together=True)
            finally:
                await sql.close()

    memory, sql = asyncio.run(both())
    assert sql == memory


# Hypothesis: finish_run(keep_session=True) calls and resets made together, with
# the loop turning between some of them: the room ends with the session of the
# last call made (a reset's None, or that run's session).

session_call = st.tuples(st.booleans(), st.booleans())  # (a reset, not a run's end), a loop turn


async def sessions_race(store: SqlStore, calls: list[tuple[bool, bool]]) -> SessionId | None:
    runs = iter(await started(store, len(calls)))
    made: list[asyncio.Task[object]] = []
    expected: SessionId | None = None
    for reset, turn in calls:
        if reset:
            made.append(asyncio.create_task(store.set_session(ROOM, None)))
            expected = None
        else:
            run = next(runs)
            expected = SessionId(f"session of {run}")
            report = RunReport(RunStatus.SUCCEEDED, session_id=expected)
            made.append(
                asyncio.create_task(
                    store.finish_run(RunEnding(run, report, 3.0, keep_session=True))
                )
            )
        if turn:  # else the calls begin in the same loop turn (tasks start in order)
            await asyncio.sleep(0)
    await asyncio.gather(*made)
    return expected


@settings(max_examples=40, deadline=None)
@given(st.lists(session_call, min_size=1, max_size=10))
def test_the_last_call_decides_the_rooms_session(
    sqlite_template: Path, calls: list[tuple[bool, bool]]
) -> None:
    async def race() -> None:
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "store.db"
            shutil.copy(sqlite_template, path)
            sql = await SqlStore.open(f"sqlite+aiosqlite:///{path}", auto_migrate=False)
            try:
                expected = await sessions_race(sql, calls)
                assert await sql.get_session(ROOM) == expected
            finally:
                await sql.close()

    asyncio.run(race())

"""The store's share of a run's critical path, on SQLite and PostgreSQL.

Per run at most two commits on the answer's path wait for a disk sync (the
message's acceptance, and the run's end with its answer; the pid, or a
detached run's registration, written beside the running process, syncs the
run's start); reads never queue behind a write; and what an OS crash can take
(the unsynced start of a run, the room's latest progress through a run's
journal) leaves messages that recovery runs again, or progress shown again.
Sync levels are read from the database inside each commit (``PRAGMA
synchronous``, ``SHOW synchronous_commit``), not from the store's own flags.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Connection

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    LiveRun,
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
from bridge.store.base import AuditFilter, RoomOverrides, RunEnding
from bridge.store.engine import create_engine, is_sqlite
from bridge.store.sql import SqlStore
from tests.store.conftest import SQL_BACKENDS, open_backend
from tests.store.locks import write_begins, write_lock

ROOM = RoomKey(TransportName("console"), RoomId("local"))
RUN = RunId("run-1")
LIVE = LiveRun(RUN, 4240, 2**40, 4242, "/var/lib/chatbridge/runs/run-1", "host")


def inbound(external_id: str) -> InboundMessage:
    text = f"text of {external_id}"
    return InboundMessage(ROOM, UserId("me"), text, ExternalMessageId(external_id))


def commit_kind(conn: Connection) -> str:
    """What the transaction about to commit on ``conn`` is: read, synced or unsynced."""
    if conn.dialect.name == "sqlite":
        # Readers are another engine. 2 is FULL; NORMAL (1) in WAL mode does
        # not sync at commit.
        level = conn.exec_driver_sql("PRAGMA synchronous").scalar_one()
        return "synced" if level == 2 else "unsynced"
    # Readers share the pool; a read-only transaction writes no commit record.
    if conn.exec_driver_sql("SHOW transaction_read_only").scalar_one() == "on":
        return "read"
    off = conn.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "off"
    return "unsynced" if off else "synced"


@dataclass
class Transactions:
    """The writer's transactions, by the store call that made them."""

    call: str = ""
    reads: list[str] = field(default_factory=list)
    synced: list[str] = field(default_factory=list)
    unsynced: list[str] = field(default_factory=list)

    @contextmanager
    def during(self, call: str) -> Iterator[None]:
        self.call = call
        try:
            yield
        finally:
            self.call = ""


@dataclass
class Watched:
    store: SqlStore
    writer: Transactions


@pytest.fixture
async def watched(backend: str) -> AsyncIterator[Watched]:
    """A store whose writer engine reports each transaction and its sync level."""
    url = backend
    await (await open_backend(url)).close()  # empties the shared PostgreSQL database
    engine = create_engine(url)
    seen = Transactions()

    store = SqlStore(engine)

    @event.listens_for(store.writes_on, "commit")
    def _commit(conn: Connection) -> None:
        kinds = {"read": seen.reads, "synced": seen.synced, "unsynced": seen.unsynced}
        kinds[commit_kind(conn)].append(seen.call)

    try:
        yield Watched(store, seen)
    finally:
        await store.close()


SQL = pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)


@SQL
async def test_a_plain_run_syncs_twice_on_the_answers_path(watched: Watched, backend: str) -> None:
    """Accept and finish sync; on SQLite the start and every read do not wait for
    the disk (on PostgreSQL the start syncs: a server restarted on its own would
    lose it, see ``SqlStore.start_run``).

    The registration's commit (with claude's pid) syncs, off the answer's
    path: on SQLite it makes the start durable.
    """
    start_syncs = not is_sqlite(backend)
    store, writer = watched.store, watched.writer
    with writer.during("accept"):
        msg = await store.accept(inbound("$1"), 1.0)
    assert msg is not None
    with writer.during("room_state"):
        assert await store.room_state(ROOM) == (None, RoomOverrides())
    with writer.during("start_run"):
        await store.start_run(RUN, Batch(ROOM, (msg,)), 2.0)
    with writer.during("register_live_run"):
        await store.register_live_run(LIVE, 2.5)
    with writer.during("finish_run"):
        report = RunReport(RunStatus.SUCCEEDED, session_id=SessionId("s1"))
        [answer] = await store.finish_run(
            RunEnding(RUN, report, 3.0, [Reply(ROOM, "the answer")], keep_session=True)
        )
    started = ["start_run"]
    assert writer.synced == ["accept", *started * start_syncs, "register_live_run", "finish_run"]
    assert writer.unsynced == started * (not start_syncs)
    on_the_answers_path = ("accept", "room_state", "start_run", "finish_run")
    synced_on_the_path = [c for c in writer.synced if c in on_the_answers_path]
    assert synced_on_the_path == ["accept", *started * start_syncs, "finish_run"]

    # What the unsynced commits wrote is there for the next reader.
    run = await store.get_run(RUN)
    assert run is not None
    assert (run.status, run.pid, run.message_ids) == (RunStatus.SUCCEEDED, 4242, (msg.id,))
    assert await store.get_session(ROOM) == SessionId("s1")
    assert await store.undelivered() == [answer]
    # A synced commit after an unsynced one still syncs: the level is per transaction.
    with writer.during("accept again"):
        assert await store.accept(inbound("$2"), 4.0) is not None
    assert writer.synced[-1] == "accept again"


@SQL
async def test_a_detached_run_syncs_its_registration_not_its_progress(
    watched: Watched, backend: str
) -> None:
    """The registration takes the pid's place: synced, off the answer's path.

    The room's progress through the journal commits without a sync; the end
    removes the registration within its own synced commit.
    """
    store, writer = watched.store, watched.writer
    with writer.during("accept"):
        msg = await store.accept(inbound("$1"), 1.0)
    assert msg is not None
    with writer.during("start_run"):
        await store.start_run(RUN, Batch(ROOM, (msg,)), 2.0)
    with writer.during("register_live_run"):
        await store.register_live_run(LIVE, 2.5)
    with writer.during("set_delivered_offset"):
        await store.set_delivered_offset(RUN, 4096)
    [registered] = await store.live_runs()
    assert (registered.live, registered.delivered_offset) == (LIVE, 4096)
    with writer.during("finish_run"):
        await store.finish_run(
            RunEnding(RUN, RunReport(RunStatus.SUCCEEDED), 3.0, [Reply(ROOM, "done")])
        )
    if is_sqlite(backend):
        assert writer.synced == ["accept", "register_live_run", "finish_run"]
        assert writer.unsynced == ["start_run", "set_delivered_offset"]
    else:
        assert writer.synced == ["accept", "start_run", "register_live_run", "finish_run"]
        assert writer.unsynced == ["set_delivered_offset"]
    assert await store.live_runs() == []


@SQL
async def test_reads_proceed_while_a_write_waits(watched: Watched, backend: str) -> None:
    """Another connection holds the write lock; the store's write waits, its reads do not."""
    store = watched.store
    msg = await store.accept(inbound("$1"), 1.0)
    assert msg is not None
    await store.start_run(RUN, Batch(ROOM, (msg,)), 2.0)
    write_begun = write_begins(store, backend, "INSERT INTO messages")

    async def every_read() -> list[object]:
        await store.ping()
        return [
            await store.get_session(ROOM),
            await store.get_run(RUN),
            await store.running_runs(),
            await store.live_runs(),
            await store.last_run(ROOM),
            await store.retryable_runs(ROOM),
            await store.pending_messages(),
            await store.pending_message(ROOM, ExternalMessageId("$1")),
            await store.messages([msg.id]),
            await store.message_states([msg.id]),
            await store.undelivered(),
            await store.audit_trail(AuditFilter(room=ROOM)),
        ]

    async with write_lock(backend) as lock:
        write = asyncio.create_task(store.accept(inbound("$2"), 3.0))
        await write_begun.wait()
        reads = asyncio.create_task(every_read())
        # The write cannot end while the lock is held (or it fails after the
        # busy timeout): the reads must end first.
        done, _ = await asyncio.wait([reads, write], return_when=asyncio.FIRST_COMPLETED)
        assert done == {reads}
        await lock.release()
        assert await write is not None
    results = reads.result()
    assert results[6] == []  # dispatched
    assert results[2] != []  # running


async def test_an_os_crash_loses_at_most_the_start_of_a_run(tmp_path: Path) -> None:
    """The disk after an OS crash holds the WAL up to the last synced commit.

    Cutting the log there (the unsynced start_run gone) leaves the message
    pending and no run: recovery re-queues it. Once the pid is recorded, a
    synced commit, the start survives the same cut.
    """
    path = tmp_path / "live.db"
    store = await SqlStore.open(f"sqlite+aiosqlite:///{path}")
    try:
        msg = await store.accept(inbound("$1"), 1.0)
        assert msg is not None
        wal = path.with_name(path.name + "-wal")
        synced_size = wal.stat().st_size
        await store.start_run(RUN, Batch(ROOM, (msg,)), 2.0)
        assert wal.stat().st_size > synced_size  # written, just not synced
        # Copied while the store is open: closing would checkpoint the log.
        crashed = crash_copy(path, synced_size, tmp_path / "crashed")
        await store.register_live_run(LIVE, 2.5)  # with claude's pid, 4242
        pid_recorded = crash_copy(path, wal.stat().st_size, tmp_path / "pid")
    finally:
        await store.close()
    after = await SqlStore.open(f"sqlite+aiosqlite:///{crashed / path.name}", auto_migrate=False)
    try:
        assert await after.pending_messages() == [msg]
        assert await after.running_runs() == []
        assert await after.get_run(RUN) is None
        # The restart runs it again (the same run id even: nothing is left of it).
        await after.start_run(RUN, Batch(ROOM, (msg,)), 5.0)
    finally:
        await after.close()
    after = await SqlStore.open(f"sqlite+aiosqlite:///{pid_recorded / path.name}")
    try:
        assert await after.pending_messages() == []
        assert [(r.id, r.pid) for r in await after.running_runs()] == [(RUN, 4242)]
    finally:
        await after.close()


async def test_an_os_crash_keeps_the_registration_and_may_lose_progress(tmp_path: Path) -> None:
    """The registration is synced: the run is found again. The offset is not:
    cut back to the last synced commit, the room is shown a little again."""
    path = tmp_path / "live.db"
    store = await SqlStore.open(f"sqlite+aiosqlite:///{path}")
    try:
        msg = await store.accept(inbound("$1"), 1.0)
        assert msg is not None
        await store.start_run(RUN, Batch(ROOM, (msg,)), 2.0)
        await store.register_live_run(LIVE, 2.5)
        wal = path.with_name(path.name + "-wal")
        synced_size = wal.stat().st_size
        await store.set_delivered_offset(RUN, 4096)
        assert wal.stat().st_size > synced_size  # written, just not synced
        crashed = crash_copy(path, synced_size, tmp_path / "crashed")
    finally:
        await store.close()
    after = await SqlStore.open(f"sqlite+aiosqlite:///{crashed / path.name}", auto_migrate=False)
    try:
        [registered] = await after.live_runs()
        assert (registered.live, registered.delivered_offset) == (LIVE, 0)
        assert [(r.id, r.pid) for r in await after.running_runs()] == [(RUN, LIVE.claude_pid)]
    finally:
        await after.close()


def crash_copy(path: Path, wal_size: int, into: Path) -> Path:
    """The database at ``path`` as the disk holds it with ``wal_size`` bytes of its WAL."""
    into.mkdir()
    shutil.copy(path, into / path.name)
    wal = path.with_name(path.name + "-wal")
    (into / wal.name).write_bytes(wal.read_bytes()[:wal_size])
    return into

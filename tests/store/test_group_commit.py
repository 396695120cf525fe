"""Group commit of ``SqlStore.accept`` on a real database: SQLite and PostgreSQL.

A second connection holds the write lock (SQLite ``BEGIN IMMEDIATE``,
PostgreSQL ``LOCK TABLE messages``) so the first transaction waits while the
test queues more callers behind it; an engine hook tells when the store's
write is under way, so nothing here sleeps.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import asyncpg
import pytest
from sqlalchemy import event
from sqlalchemy.engine import make_url

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
from bridge.store.engine import create_engine, is_sqlite
from bridge.store.sql import ACCEPT_GROUP_LIMIT, SqlStore
from tests.store.conftest import SQL_BACKENDS, open_backend
from tests.store.locks import write_lock

pytestmark = pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)

ROOM = RoomKey(TransportName("console"), RoomId("local"))
OTHER_ROOM = RoomKey(TransportName("slack"), RoomId("C1"))


def inbound(external_id: str, room: RoomKey = ROOM) -> InboundMessage:
    return InboundMessage(
        room, UserId("me"), f"text of {external_id}", ExternalMessageId(external_id)
    )


@dataclass
class Observed:
    """A store on its own engine, and what that engine did."""

    store: SqlStore
    url: str
    commits: int = 0
    writes: int = 0
    """Transactions that reached the statement where a held lock blocks them."""
    tasks: list[asyncio.Task[Message | None]] = field(default_factory=list)
    _waiting: list[tuple[int, asyncio.Event]] = field(default_factory=list)

    def saw_write(self) -> None:
        # On the event loop's thread (an engine hook hands it over).
        self.writes += 1
        for n, seen in self._waiting:
            if self.writes >= n:
                seen.set()

    async def writes_begun(self, n: int) -> None:
        """Wait until ``n`` write transactions have reached their blocking statement."""
        if self.writes < n:
            seen = asyncio.Event()
            self._waiting.append((n, seen))
            await seen.wait()

    async def start(self, msg: InboundMessage) -> asyncio.Task[Message | None]:
        """Call ``accept`` in a task; returns once the call is queued or leading."""
        queued = asyncio.Event()

        async def call() -> Message | None:
            queued.set()
            # accept() queues (or starts leading) before it first suspends.
            return await self.store.accept(msg, 1.0)

        task = asyncio.create_task(call())
        self.tasks.append(task)
        await queued.wait()
        return task


@pytest.fixture
async def observed(backend: str) -> AsyncIterator[Observed]:
    await (await open_backend(backend)).close()  # empties the shared PostgreSQL database
    engine = create_engine(backend)
    made = Observed(SqlStore(engine), backend)
    # SQLite waits at BEGIN IMMEDIATE for a held lock, PostgreSQL at the INSERT.
    blocking = "BEGIN IMMEDIATE" if is_sqlite(backend) else "INSERT INTO messages"

    loop = asyncio.get_running_loop()

    # On a SQLite file the hooks run in the store's writer thread.
    @event.listens_for(made.store.writes_on, "before_cursor_execute")
    def _statement(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if statement.startswith(blocking):
            loop.call_soon_threadsafe(made.saw_write)

    @event.listens_for(made.store.writes_on, "commit")
    def _commit(_conn: object) -> None:
        made.commits += 1

    try:
        yield made
    finally:
        for task in made.tasks:
            task.cancel()
        await asyncio.gather(*made.tasks, return_exceptions=True)
        await made.store.close()


async def accepted_audit(store: SqlStore) -> list[int]:
    """Message ids of the ``message_accepted`` audit rows, oldest first."""
    return [
        r.message_id
        for r in await store.audit_trail()
        if r.action is AuditAction.MESSAGE_ACCEPTED and r.message_id is not None
    ]


async def test_concurrent_accepts_with_redeliveries_are_exact(observed: Observed) -> None:
    """As if the calls had come one after the other, in call order, in few commits."""
    store = observed.store
    before = [await store.accept(inbound(f"$old{i}"), 1.0) for i in range(3)]
    assert observed.commits == 3
    keys = [f"$m{i}" for i in range(60)] + [f"$old{i}" for i in range(3)]
    calls = [inbound(k, room) for k in keys for room in (ROOM, OTHER_ROOM)]
    calls += [inbound(k) for k in keys[::3]] * 2  # redelivered within the burst
    random.Random(7).shuffle(calls)

    results = await asyncio.gather(*(store.accept(m, 2.0) for m in calls))
    # Calls made in the same turn of the loop share one commit.
    assert observed.commits == 3 + 1

    winners: list[Message] = []
    seen: set[tuple[RoomKey, str]] = {(m.room, m.external_id) for m in before if m is not None}
    for msg, result in zip(calls, results, strict=True):
        key = (msg.room, msg.external_id)
        if key in seen:
            assert result is None, msg
        else:
            # The first call with a key is the one accepted.
            assert result is not None, msg
            assert (result.room, result.external_id, result.text) == (*key, msg.text)
            seen.add(key)
            winners.append(result)
    assert len(winners) == 2 * len(keys) - len(before)
    ids = [m.id for m in winners]
    assert ids == sorted(ids)  # in call order
    assert await store.pending_messages() == [*before, *winners]
    assert await accepted_audit(store) == [m.id for m in [*before, *winners] if m is not None]


async def test_a_transaction_holds_at_most_the_limit(observed: Observed) -> None:
    n = ACCEPT_GROUP_LIMIT + 44
    results = await asyncio.gather(
        *(observed.store.accept(inbound(f"$m{i}"), 1.0) for i in range(n))
    )
    assert all(r is not None for r in results)
    assert observed.commits == 2  # the limit, then the 44 left


async def test_cancelled_leader_leaves_followers_correct(observed: Observed) -> None:
    """The leader's transaction rolls back; its followers are served by a new leader."""
    async with write_lock(observed.url) as lock:
        leader = await observed.start(inbound("$lead"))
        await observed.writes_begun(1)
        first = await observed.start(inbound("$f"))
        same_as_leader = await observed.start(inbound("$lead"))
        again = await observed.start(inbound("$f"))
        leader.cancel()
        # Two turns of the loop: the leader takes its cancellation and cancels its
        # transaction, which tells the writer thread before the lock comes free.
        for _ in range(2):
            await asyncio.sleep(0)
        await lock.release()
        with pytest.raises(asyncio.CancelledError):
            await leader
    a, b, c = await first, await same_as_leader, await again
    assert a is not None
    assert b is not None  # the leader's copy was rolled back: this one is the message
    assert c is None
    assert a.id < b.id
    assert await observed.store.pending_messages() == [a, b]
    assert await accepted_audit(observed.store) == [a.id, b.id]


async def test_cancelled_follower_leaves_the_others_correct(observed: Observed) -> None:
    async with write_lock(observed.url) as lock:
        leader = await observed.start(inbound("$1"))
        await observed.writes_begun(1)
        b, c, d = [await observed.start(inbound(f"${i}")) for i in (2, 3, 4)]
        c.cancel()
        with pytest.raises(asyncio.CancelledError):
            await c
        await lock.release()
        results = [await leader, await b, await d]
    assert [r.external_id if r else None for r in results] == ["$1", "$2", "$4"]
    assert await observed.store.pending_messages() == results
    assert await accepted_audit(observed.store) == [r.id for r in results if r is not None]
    # Queued when cancelled: nothing was recorded, so a redelivery is accepted.
    assert await observed.store.accept(inbound("$3"), 2.0) is not None


async def test_a_refused_message_fails_only_its_own_call(observed: Observed) -> None:
    """The group goes again one by one: the others are accepted, in order."""
    async with _rejecting(observed.url, "$bad"), write_lock(observed.url) as lock:
        leader = await observed.start(inbound("$1"))
        await observed.writes_begun(1)
        two, bad, three = [await observed.start(inbound(k)) for k in ("$2", "$bad", "$3")]
        await lock.release()
        results = [await leader, await two, await three]
        with pytest.raises(StoreError, match="rejected"):
            await bad
    assert [r.external_id if r else None for r in results] == ["$1", "$2", "$3"]
    assert await observed.store.pending_messages() == results
    assert await accepted_audit(observed.store) == [r.id for r in results if r is not None]
    # The refused one was not recorded: once the database takes it, it is accepted.
    assert await observed.store.accept(inbound("$bad"), 2.0) is not None


async def test_closing_fails_the_queued_calls(observed: Observed) -> None:
    async with write_lock(observed.url) as lock:
        leader = await observed.start(inbound("$1"))
        await observed.writes_begun(1)
        queued = [await observed.start(inbound(k)) for k in ("$2", "$3")]
        # close() fails the queued calls at once, then waits for the
        # transaction in flight, which the lock holds.
        closing = asyncio.create_task(observed.store.close())
        try:
            for task in queued:
                with pytest.raises(StoreError, match="closed"):
                    await task
            await lock.release()
            first = await leader
        finally:
            await closing
    assert first is not None
    reopened = await SqlStore.open(observed.url, auto_migrate=False)
    try:
        assert await reopened.pending_messages() == [first]
    finally:
        await reopened.close()


@asynccontextmanager
async def _rejecting(url: str, external_id: str) -> AsyncIterator[None]:
    """A trigger that makes the database refuse messages with this external id."""
    if is_sqlite(url):
        conn = sqlite3.connect(str(make_url(url).database), isolation_level=None)
        try:
            conn.execute(
                "CREATE TRIGGER reject BEFORE INSERT ON messages"
                f" WHEN NEW.external_id = '{external_id}'"
                " BEGIN SELECT RAISE(ABORT, 'rejected'); END"
            )
            yield
        finally:
            conn.execute("DROP TRIGGER IF EXISTS reject")
            conn.close()
        return
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    pg = await asyncpg.connect(dsn)
    try:
        await pg.execute(
            "CREATE FUNCTION reject() RETURNS trigger LANGUAGE plpgsql AS $$"
            f" BEGIN IF NEW.external_id = '{external_id}' THEN RAISE EXCEPTION 'rejected';"
            " END IF; RETURN NEW; END $$;"
            " CREATE TRIGGER reject BEFORE INSERT ON messages"
            " FOR EACH ROW EXECUTE FUNCTION reject()"
        )
        yield
    finally:
        await pg.execute(
            "DROP TRIGGER IF EXISTS reject ON messages; DROP FUNCTION IF EXISTS reject()"
        )
        await pg.close()

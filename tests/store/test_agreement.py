"""Hypothesis: the memory store and the SQLite store agree on random histories.

The contract suite pins the rules one case at a time; this drives both stores
through the same random sequence of operations (including interleavings no
one thought to write down) and requires identical answers throughout.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    LiveRun,
    Message,
    MessageId,
    RoomId,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
    SessionId,
    TransportName,
    UserId,
)
from bridge.store.base import RunEnding, StoreError
from bridge.store.memory import MemoryStore
from bridge.store.sql import SqlStore
from tests.store.conftest import InspectableStore

ROOMS = (
    RoomKey(TransportName("matrix"), RoomId("!a")),
    RoomKey(TransportName("slack"), RoomId("C1")),
)
USER = UserId("u")
ENDINGS = [s for s in RunStatus if s is not RunStatus.RUNNING]

room_index = st.integers(0, len(ROOMS) - 1)
accept = st.tuples(st.just("accept"), room_index, st.integers(0, 5))
start = st.tuples(st.just("start"), room_index, st.integers(1, 3))
finish = st.tuples(st.just("finish"), st.integers(0, 10), st.sampled_from(ENDINGS))
# Mostly a running run (else any run: a finished one is refused), then which registration.
register = st.tuples(st.just("register"), st.booleans(), st.integers(0, 10), st.integers(1, 3))
# Mostly a registered run (else any run: ignored unless registered), then the offset.
offset = st.tuples(
    st.just("offset"), st.booleans(), st.integers(0, 10), st.sampled_from([0, 7, 2**40])
)
operation = st.one_of(
    # Accepting, starting and finishing are listed twice: most interesting
    # histories need several of each.
    accept,
    accept,
    start,
    start,
    finish,
    finish,
    st.tuples(st.just("ignore"), room_index),
    st.tuples(st.just("command"), st.integers(0, 30)),
    st.tuples(st.just("drop"), room_index),
    st.tuples(st.just("retry"), room_index),
    st.tuples(st.just("session"), room_index, st.sampled_from([None, "s1", "s2"])),
    st.tuples(st.just("prune"), st.integers(0, 30)),
    # Twice each: progress and a reattach need a registered run, and an
    # offset that would go back needs two on one run (hence few values).
    register,
    register,
    offset,
    offset,
)


@dataclass
class History:
    """What the operations so far produced, to pick later operations' targets."""

    now: float = 1000.0
    message_ids: list[MessageId] = field(default_factory=list)
    run_ids: list[RunId] = field(default_factory=list)


async def apply(store: InspectableStore, op: tuple[Any, ...], history: History) -> object:
    """Carry out one operation; return what the store answered.

    Reads ``history`` but leaves it alone: the caller applies each operation
    to both stores first, then records what it produced.
    """
    kind, *args = op
    now = history.now
    match kind:
        case "accept":
            room, n = ROOMS[args[0]], args[1]
            msg = InboundMessage(room, USER, f"text {n}", ExternalMessageId(f"${n}"))
            return await store.accept(msg, now)
        case "ignore":
            msg = InboundMessage(ROOMS[args[0]], USER, "secret", ExternalMessageId("$i"))
            await store.record_ignored(msg, "not allowed", now)
            return None
        case "command" if history.message_ids:
            target = history.message_ids[args[0] % len(history.message_ids)]
            await store.complete_command(target)
            return None
        case "start":
            room = ROOMS[args[0]]
            batch = [m for m in await store.pending_messages() if m.room == room][: args[1]]
            if not batch:
                return None
            run_id = RunId(f"run-{len(history.run_ids)}")
            await store.start_run(run_id, Batch(room, tuple(batch)), now)
            return run_id
        case "finish" if history.run_ids:
            run_id = history.run_ids[args[0] % len(history.run_ids)]
            # Costs in quarters: sums are exact, in whatever order a backend adds them.
            cost = 0.25 * (args[0] % 3) if args[0] % 3 else None
            report = RunReport(status=args[1], result_text="r" * 5000, error="e", cost_usd=cost)
            try:
                await store.finish_run(RunEnding(run_id, report, now))
            except StoreError:
                return "refused"  # pruned since it ended: both must say so
            return None
        case "drop":
            room = ROOMS[args[0]]
            ids = [m.id for m in await store.pending_messages() if m.room == room]
            last = await store.last_run(room)
            if last is not None:
                ids += last.message_ids
            await store.mark_dropped(ids, USER, now)
            return None
        case "retry":
            offered = await store.retryable_runs(ROOMS[args[0]])
            return None if not offered else await store.requeue_run(offered[-1].id)
        case "session":
            session = None if args[1] is None else SessionId(args[1])
            await store.set_session(ROOMS[args[0]], session)
            return None
        case "prune":
            return await store.prune(now - args[0])
        case "register" if history.run_ids:
            running = [r.id for r in await store.running_runs()] if args[0] else []
            targets = running or history.run_ids
            run_id, n = targets[args[1] % len(targets)], args[2]
            live = LiveRun(run_id, 100 + n, 2**40 + n, 200 + n, f"/runs/{run_id}", f"host-{n}")
            try:
                await store.register_live_run(live, now)
            except StoreError:
                return "refused"
            return None
        case "offset" if history.run_ids:
            registered = [r.live.run_id for r in await store.live_runs()] if args[0] else []
            targets = registered or history.run_ids
            await store.set_delivered_offset(targets[args[1] % len(targets)], args[2])
            return None
    return None


async def snapshot(store: InspectableStore, history: History) -> object:
    """Everything observable through the interface."""
    return (
        await store.pending_messages(),
        await store.messages(history.message_ids),
        await store.message_states(history.message_ids),
        await store.running_runs(),
        await store.live_runs(),
        [await store.get_run(r) for r in history.run_ids],
        [await store.last_run(r) for r in ROOMS],
        [await store.retryable_runs(r) for r in ROOMS],
        [await store.get_session(r) for r in ROOMS],
        await store.audit_trail(),
        [await store.spend(0.0, r) for r in ROOMS],
        await store.spend(history.now - 3),
    )


async def agree(template: Path, operations: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory(prefix="agreement-") as directory:
        path = Path(directory) / "store.db"
        shutil.copy(template, path)
        memory = MemoryStore()
        sql = await SqlStore.open(f"sqlite+aiosqlite:///{path}", auto_migrate=False)
        try:
            history = History()
            for op in operations:
                expected = await apply(memory, op, history)
                answer = await apply(sql, op, history)
                assert answer == expected, op
                if isinstance(answer, Message):
                    history.message_ids.append(answer.id)
                elif op[0] == "start" and answer is not None:
                    history.run_ids.append(RunId(str(answer)))
                history.now += 1.0
            assert await snapshot(sql, history) == await snapshot(memory, history)
        finally:
            await sql.close()


@settings(max_examples=40, deadline=None, database=None)
@given(operations=st.lists(operation, min_size=5, max_size=30))
def test_memory_and_sqlite_agree(sqlite_template: Path, operations: list[tuple[Any, ...]]) -> None:
    asyncio.run(agree(sqlite_template, operations))


# Runs are rare in the histories above (a start needs pending messages of its
# room); the registry's histories begin with four running runs instead.
RUNNING = [
    *(("accept", i % 2, i) for i in range(4)),
    *(("start", i % 2, 1) for i in range(4)),
]
registry_operation = st.one_of(
    register,
    register,
    offset,
    offset,
    finish,
    st.tuples(st.just("prune"), st.integers(0, 30)),
    accept,
    start,
)


@settings(max_examples=40, deadline=None, database=None)
@given(operations=st.lists(registry_operation, min_size=3, max_size=20))
def test_memory_and_sqlite_agree_on_the_registry(
    sqlite_template: Path, operations: list[tuple[Any, ...]]
) -> None:
    asyncio.run(agree(sqlite_template, [*RUNNING, *operations]))

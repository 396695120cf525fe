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
            report = RunReport(status=args[1], result_text="r" * 5000, error="e")
            await store.finish_run(run_id, report, now)
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
    return None


async def snapshot(store: InspectableStore, history: History) -> object:
    """Everything observable through the interface."""
    return (
        await store.pending_messages(),
        await store.messages(history.message_ids),
        await store.message_states(history.message_ids),
        await store.running_runs(),
        [await store.get_run(r) for r in history.run_ids],
        [await store.last_run(r) for r in ROOMS],
        [await store.retryable_runs(r) for r in ROOMS],
        [await store.get_session(r) for r in ROOMS],
        await store.audit_trail(),
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

"""Review 5: a group of runs ending together (Core executemany ``_END_RUN``, the
cached sessions upsert) records each run's own values, as one-by-one calls do."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    RoomId,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
    SessionId,
    TransportName,
    UserId,
)
from bridge.store.base import RunEnding, Store
from bridge.store.memory import MemoryStore
from bridge.store.sql import FINISH_GROUP_LIMIT
from tests.store.conftest import SQL_BACKENDS, open_backend

ROOMS = [
    RoomKey(TransportName("console"), RoomId("local")),
    RoomKey(TransportName("slack"), RoomId("C1")),
    RoomKey(TransportName("matrix"), RoomId("!r:example.org")),
]
ENDINGS = [s for s in RunStatus if s is not RunStatus.RUNNING]


def report(i: int) -> RunReport:
    """Distinct values per run, some None/empty, so a column taken from another row shows."""
    full = i % 3 != 0
    return RunReport(
        ENDINGS[i % len(ENDINGS)],
        exit_code=i if full else None,
        session_id=SessionId(f"s{i}") if i % 4 != 1 else None,
        cost_usd=0.01 * (i + 1) if full else None,
        num_turns=i + 1 if i % 2 else None,
        duration_ms=1000 + i if full else None,
        result_text=f"result {i}" if i % 2 == 0 else "",
        error=f"error {i}" if i % 5 == 1 else "",
        session_not_found=i % 7 == 3,
    )


async def scenario(
    store: Store, n: int
) -> tuple[list[tuple[Any, ...]], list[SessionId | None], list[RunId]]:
    runs: list[RunId] = []
    for i in range(n):
        room = ROOMS[i % len(ROOMS)]
        msg = await store.accept(
            InboundMessage(room, UserId("u"), f"m{i}", ExternalMessageId(f"$m{i}")), 1.0
        )
        assert msg is not None
        run = RunId(f"run-{i}")
        await store.start_run(run, Batch(room, (msg,)), 2.0)
        runs.append(run)
    # One run ended already, before the group.
    await store.finish_run(RunEnding(runs[0], RunReport(RunStatus.FAILED, error="early"), 2.5))
    calls = [
        store.finish_run(RunEnding(run, report(i), 3.0 + i, keep_session=i % 2 == 0))
        for i, run in enumerate(runs)
    ]
    calls.append(store.finish_run(RunEnding(runs[1], report(99), 9.0, keep_session=True)))  # twice
    await asyncio.gather(*calls, return_exceptions=True)
    records = [await store.get_run(r) for r in runs]
    got = [(r.status, r.ended_at, r.report) for r in records if r is not None]
    assert len(got) == len(runs)
    sessions = [await store.get_session(room) for room in ROOMS]
    return got, sessions, runs


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
@pytest.mark.parametrize("n", [2, 3, 7, FINISH_GROUP_LIMIT])
async def test_each_run_of_a_group_keeps_its_own_values(backend: str, n: int) -> None:
    sql = await open_backend(backend)
    try:
        got, sessions, _ = await scenario(sql, n)
    finally:
        await sql.close()
    want, want_sessions, _ = await scenario(MemoryStore(), n)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"run {i}"
    assert sessions == want_sessions

"""The budgets part of the Store contract (the spend ledger, limit retries), on every backend."""

from __future__ import annotations

import asyncio

from bridge.core.model import RunId, RunReport, RunStatus, SessionId
from bridge.store.base import LimitResume, RunEnding
from tests.store.conftest import InspectableStore
from tests.store.rows import OTHER_ROOM, ROOM, SLACK_ROOM, accept, start


async def finish(
    store: InspectableStore,
    run_id: str,
    cost: float | None,
    at: float,
    *,
    room: object = ROOM,
    status: RunStatus = RunStatus.SUCCEEDED,
) -> RunId:
    message = await accept(store, f"${run_id}", at - 10, room=room)  # type: ignore[arg-type]
    rid = await start(store, run_id, [message], at=at - 5)
    await store.finish_run(RunEnding(rid, RunReport(status, cost_usd=cost), at))
    return rid


async def test_spend_sums_costs_since_a_time_by_room_and_overall(
    store: InspectableStore,
) -> None:
    assert await store.spend(0.0) == 0.0
    assert await store.spend(0.0, ROOM) == 0.0
    await finish(store, "run-1", 0.25, 1000.0)
    await finish(store, "run-2", 0.5, 2000.0)
    await finish(store, "run-3", 1.0, 2000.0, room=OTHER_ROOM)
    await finish(store, "run-4", 2.0, 2500.0, room=SLACK_ROOM)  # same room id, other transport
    assert await store.spend(0.0, ROOM) == 0.75
    assert await store.spend(1500.0, ROOM) == 0.5
    assert await store.spend(2000.0, ROOM) == 0.5  # "at or after"
    assert await store.spend(2000.1, ROOM) == 0.0
    assert await store.spend(1500.0) == 3.5
    assert await store.spend(1500.0, SLACK_ROOM) == 2.0


async def test_runs_without_a_cost_add_nothing_and_failed_runs_count(
    store: InspectableStore,
) -> None:
    await finish(store, "run-1", None, 1000.0)
    await finish(store, "run-2", 0.125, 1000.0, status=RunStatus.FAILED)
    await finish(store, "run-3", 0.0, 1000.0)
    assert await store.spend(0.0, ROOM) == 0.125


async def test_only_the_first_report_of_a_run_is_counted(store: InspectableStore) -> None:
    rid = await finish(store, "run-1", 0.5, 1000.0)
    await store.finish_run(RunEnding(rid, RunReport(RunStatus.SUCCEEDED, cost_usd=0.5), 1001.0))
    assert await store.spend(0.0) == 0.5


async def test_group_committed_ends_each_count(store: InspectableStore) -> None:
    runs = []
    for i in range(5):
        message = await accept(store, f"$m{i}", 100.0)
        runs.append(await start(store, f"run-{i}", [message]))
    await asyncio.gather(
        *(
            store.finish_run(RunEnding(rid, RunReport(RunStatus.SUCCEEDED, cost_usd=0.25), 500.0))
            for rid in runs
        )
    )
    assert await store.spend(0.0, ROOM) == 1.25


async def test_the_ledger_survives_a_reset_and_the_runs_pruning(store: InspectableStore) -> None:
    await finish(store, "run-1", 0.5, 1000.0)
    await store.set_session(ROOM, None)
    await store.set_session(ROOM, SessionId("s"))
    assert await store.spend(0.0, ROOM) == 0.5
    # Pruned by age like the rest: the older row goes, the newer stays.
    await finish(store, "run-2", 0.25, 5000.0)
    await store.prune(2000.0)
    assert await store.get_run(RunId("run-1")) is None
    assert await store.spend(0.0, ROOM) == 0.25


async def test_limit_resumes_are_kept_once_and_dropped_once(store: InspectableStore) -> None:
    assert await store.limit_resumes() == []
    await store.add_limit_resume(RunId("run-b"), OTHER_ROOM, 3000.0)
    await store.add_limit_resume(RunId("run-a"), ROOM, 2000.0)
    await store.add_limit_resume(RunId("run-a"), ROOM, 9000.0)  # the first time stands
    assert await store.limit_resumes() == [
        LimitResume(RunId("run-a"), ROOM, 2000.0),
        LimitResume(RunId("run-b"), OTHER_ROOM, 3000.0),
    ]
    assert await store.drop_limit_resume(RunId("run-a")) is True
    assert await store.drop_limit_resume(RunId("run-a")) is False
    assert await store.limit_resumes() == [LimitResume(RunId("run-b"), OTHER_ROOM, 3000.0)]


async def test_a_limit_retry_and_its_calling_off_one_wins(store: InspectableStore) -> None:
    limited = await finish(store, "run-a", 0.0, 1000.0, status=RunStatus.FAILED)
    await store.add_limit_resume(limited, ROOM, 2000.0)
    await store.add_limit_resume(RunId("run-b"), ROOM, 2000.0)
    # Made: the retry is forgotten and the messages queued again, together.
    [message] = await store.requeue_limit_resume(limited) or []
    assert message.external_id == "$run-a"
    assert await store.limit_resumes() == [LimitResume(RunId("run-b"), ROOM, 2000.0)]
    assert await store.requeue_limit_resume(limited) is None  # not made twice
    # Called off first: never made.
    assert await store.drop_limit_resume(RunId("run-b")) is True
    assert await store.requeue_limit_resume(RunId("run-b")) is None


async def test_a_threads_cost_is_its_rooms_and_its_retry_keeps_the_thread(
    store: InspectableStore,
) -> None:
    thread = ROOM.in_thread("1700000000.000100")
    await finish(store, "run-1", 0.25, 1000.0, room=thread)
    await finish(store, "run-2", 0.5, 1000.0)
    assert await store.spend(0.0, ROOM) == 0.75
    assert await store.spend(0.0, thread) == 0.75  # a budget is the room's, threads and all
    await store.add_limit_resume(RunId("run-1"), thread, 5000.0)
    assert await store.limit_resumes() == [LimitResume(RunId("run-1"), thread, 5000.0)]

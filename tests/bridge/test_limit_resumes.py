"""The retry after a usage limit, against the memory store: made once, only after the run's
end is recorded, whoever retried first (see bridge/runs/usage.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    InboundMessage,
    Message,
    RoomId,
    RoomKey,
    RunId,
    RunReport,
    RunStatus,
    TransportName,
    UserId,
)
from bridge.metrics import Metrics
from bridge.outbound.notices import Notices
from bridge.outbound.outbox import Outbox
from bridge.outbound.replies import Replier
from bridge.runs.usage import LimitResumes
from bridge.store.base import LimitResume, RunEnding
from bridge.store.memory import MemoryStore
from runner import UsageLimited

ROOM = RoomKey(TransportName("matrix"), RoomId("!a:x"))
RUN = RunId("run-1")


async def limited_run(store: MemoryStore) -> Message:
    inbound = InboundMessage(ROOM, UserId("@u:x"), "big job", ExternalMessageId("$1"))
    message = await store.accept(inbound, 10.0)
    assert message is not None
    await store.start_run(RUN, Batch(ROOM, (message,)), 20.0)
    await store.add_limit_resume(RUN, ROOM, 100.0)
    return message


def resumes(store: MemoryStore, submitted: list[Message], clock: list[float]) -> LimitResumes:
    metrics = Metrics()
    # No transports: the notices stay in the store's outbox, where the test reads them.
    notices = Notices(store, Outbox(store, {}, metrics), Replier({}))
    return LimitResumes(
        store, submitted.append, notices, metrics, enabled=True, wall_clock=lambda: clock[0]
    )


def recording(submitted: list[Message], made: asyncio.Event) -> Callable[[Message], None]:
    def submit(message: Message) -> None:
        submitted.append(message)
        made.set()

    return submit


async def notices(store: MemoryStore) -> list[str]:
    return [e.reply.text for e in await store.undelivered()]


async def test_the_retry_waits_for_the_runs_end_and_is_made_once() -> None:
    store, submitted, clock = MemoryStore(), list[Message](), [150.0]
    message = await limited_run(store)
    limits = resumes(store, submitted, clock)
    entry = LimitResume(RUN, ROOM, 100.0)

    # The run's end is not recorded yet: nothing to queue, and the record stays.
    assert await limits._resume(entry) is False
    assert await store.limit_resumes() == [entry]

    await store.finish_run(RunEnding(RUN, RunReport(RunStatus.FAILED, error="limit"), 30.0))
    assert await limits._resume(entry) is True
    assert [m.id for m in submitted] == [message.id]
    assert await store.limit_resumes() == []
    assert await notices(store) == ["The usage limit has reset: retrying run `run-1`."]

    # A restart that found the record again (dropped after the re-queue, say): nothing twice.
    await store.add_limit_resume(RUN, ROOM, 100.0)
    assert await limits._resume(entry) is True
    assert len(submitted) == 1
    assert await store.limit_resumes() == []


async def test_a_retry_by_hand_first_leaves_nothing_for_the_reset() -> None:
    store, submitted, clock = MemoryStore(), list[Message](), [150.0]
    await limited_run(store)
    await store.finish_run(RunEnding(RUN, RunReport(RunStatus.FAILED, error="limit"), 30.0))
    assert len(await store.requeue_run(RUN)) == 1  # !retry
    limits = resumes(store, submitted, clock)
    assert await limits._resume(LimitResume(RUN, ROOM, 100.0)) is True
    assert submitted == []
    assert await notices(store) == []


async def test_serve_makes_a_retry_whose_reset_passed_while_it_was_down() -> None:
    store, submitted, clock = MemoryStore(), list[Message](), [150.0]
    await limited_run(store)
    await store.finish_run(RunEnding(RUN, RunReport(RunStatus.FAILED, error="limit"), 30.0))
    made = asyncio.Event()
    limits = resumes(store, submitted, clock)
    limits.submit = recording(submitted, made)
    serving = asyncio.create_task(limits.serve())
    try:
        async with asyncio.timeout(10):
            await made.wait()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert len(submitted) == 1


async def test_serve_waits_for_the_reset_and_a_noted_end() -> None:
    store, submitted, clock = MemoryStore(), list[Message](), [50.0]
    await limited_run(store)
    made = asyncio.Event()
    limits = resumes(store, submitted, clock)
    limits.submit = recording(submitted, made)
    serving = asyncio.create_task(limits.serve())
    try:
        await asyncio.sleep(0)  # (it lists the record: not due, it waits)
        clock[0] = 150.0  # the reset passed, but the run's end is not recorded
        await store.finish_run(RunEnding(RUN, RunReport(RunStatus.FAILED, error="limit"), 30.0))
        limits.noted()
        async with asyncio.timeout(10):
            await made.wait()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert len(submitted) == 1
    assert await store.limit_resumes() == []


async def test_a_reset_already_past_is_not_retried_by_itself() -> None:
    # claude said the limit resets at a time already gone (a clock off, a stale
    # window): retried at once, the retry would hit the limit again, with the same
    # past reset, and be retried again, round after round.
    store, submitted, clock = MemoryStore(), list[Message](), [150.0]
    inbound = InboundMessage(ROOM, UserId("@u:x"), "big job", ExternalMessageId("$1"))
    message = await store.accept(inbound, 10.0)
    assert message is not None
    batch = Batch(ROOM, (message,))
    await store.start_run(RUN, batch, 20.0)
    limits = resumes(store, submitted, clock)
    text = await limits.limited(RUN, batch, UsageLimited(100.0, "five_hour"))
    assert await store.limit_resumes() == []
    assert "retries this run" not in text
    assert text.endswith("`!retry run-1` runs it again after that.")
    # A reset still to come is retried then.
    text = await limits.limited(RUN, batch, UsageLimited(200.0, "five_hour"))
    assert await store.limit_resumes() == [LimitResume(RUN, ROOM, 200.0)]
    assert "chatbridge retries this run then (once)" in text


async def test_a_room_no_longer_configured_keeps_its_retry_waiting() -> None:
    # As its pending messages after a restart (Intake.recover): nothing of a room
    # taken out of the config runs, nor is it failed; the room's return retries it.
    store, submitted, clock = MemoryStore(), list[Message](), [150.0]
    message = await limited_run(store)
    await store.finish_run(RunEnding(RUN, RunReport(RunStatus.FAILED, error="limit"), 30.0))
    limits = resumes(store, submitted, clock)
    limits.configured = lambda room: False
    serving = asyncio.create_task(limits.serve())
    try:
        for _ in range(20):
            await asyncio.sleep(0)  # (it lists the record and passes it by)
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert submitted == []
    assert await store.limit_resumes() == [LimitResume(RUN, ROOM, 100.0)]
    # Still failed with its run: a !retry (or the room's return) runs it.
    assert [m.id for m in await store.requeue_run(RUN)] == [message.id]


async def test_the_retry_of_a_run_the_room_moved_past_is_not_made() -> None:
    store, submitted, clock = MemoryStore(), list[Message](), [150.0]
    await limited_run(store)
    await store.finish_run(RunEnding(RUN, RunReport(RunStatus.FAILED, error="limit"), 30.0))
    # A later message ran and succeeded: `!retry` no longer offers the run.
    later = await store.accept(
        InboundMessage(ROOM, UserId("@u:x"), "other job", ExternalMessageId("$2")), 40.0
    )
    assert later is not None
    await store.start_run(RunId("run-2"), Batch(ROOM, (later,)), 41.0)
    await store.finish_run(RunEnding(RunId("run-2"), RunReport(RunStatus.SUCCEEDED), 42.0))
    limits = resumes(store, submitted, clock)
    assert await limits.status_lines(ROOM) == []  # not listed as waiting either

    assert await limits._resume(LimitResume(RUN, ROOM, 100.0)) is True
    assert submitted == []
    assert await store.limit_resumes() == []
    assert await notices(store) == []


async def test_call_off_drops_the_rooms_waiting_retries_only() -> None:
    store, submitted, clock = MemoryStore(), list[Message](), [50.0]
    await limited_run(store)
    other = RoomKey(TransportName("matrix"), RoomId("!b:x"))
    await store.add_limit_resume(RunId("run-elsewhere"), other, 100.0)
    limits = resumes(store, submitted, clock)
    assert await limits.call_off(ROOM) == [RUN]
    assert await store.limit_resumes() == [LimitResume(RunId("run-elsewhere"), other, 100.0)]
    assert await limits.call_off(ROOM) == []

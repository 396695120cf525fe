"""The service's sink records messages handed over together in the order of the calls.

The Matrix and Slack transports rely on it (see ``InboundSink``): they start a
burst's ``accept`` calls one after the other without awaiting each, and the
intake must queue each message in the store before its first wait, so the
store's group commit records them in call order and together.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event

from bridge.config import load_settings
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
    TransportName,
    UserId,
)
from bridge.core.transport import Accepted, InboundEvent, MessageDeleted, MessageEdited
from bridge.inbound.commands import CommandHandler
from bridge.inbound.intake import Intake
from bridge.metrics import Metrics
from bridge.store.base import AuditEntry, RunEnding, RunRecord
from bridge.store.memory import MemoryStore
from bridge.store.sql import SqlStore
from dispatcher import DispatchedRun, Dispatcher, DispatchLimits
from tests.bridge.harness import ConsoleSession, run_console, write_config

ROOM = RoomKey(TransportName("console"), RoomId("console"))


async def test_messages_accepted_together_are_recorded_in_call_order_in_one_transaction(
    tmp_path: Path,
) -> None:
    texts = [f"part {i}" for i in range(20)]
    async with ConsoleSession(load_settings(write_config(tmp_path))) as session:
        service = session.service
        assert service is not None
        store = service.store
        assert isinstance(store, SqlStore)
        inserts = 0

        @event.listens_for(store.writes_on, "before_cursor_execute")
        def _statement(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
            # One INSERT of the messages per transaction of accepts (other parts
            # of the service write too, so commits alone would not tell).
            nonlocal inserts
            inserts += statement.startswith("INSERT INTO messages")

        messages = [
            InboundMessage(ROOM, UserId("local"), text, ExternalMessageId(f"ext-{i}"))
            for i, text in enumerate(texts)
        ]
        results = await asyncio.gather(*(service.parts.intake.accept(m) for m in messages))
        assert inserts == 1
        assert results == [Accepted.ACCEPTED] * len(texts)
        await session.finish()
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        rows = db.execute("select text from messages order by id").fetchall()
    assert [text for (text,) in rows] == texts


async def test_a_message_after_retry_in_one_burst_runs_after_the_retried_ones(
    tmp_path: Path,
) -> None:
    """``!retry`` then a new message, handed over at once (one Matrix sync response, one
    Slack burst): the retried message is queued first, as when they come one by one."""
    path = write_config(tmp_path, env={"FAKE_CLAUDE_EXIT": "3"})
    await run_console(path, ["first"])  # a failed run, offered for !retry
    settings = load_settings(write_config(tmp_path))
    room = RoomKey(TransportName("console"), RoomId(settings.console.room))
    user = UserId(settings.console.user)
    async with ConsoleSession(settings) as session:
        service = session.service
        assert service is not None
        retry = InboundMessage(room, user, "!retry", ExternalMessageId("x-1"))
        after = InboundMessage(room, user, "second", ExternalMessageId("x-2"))
        await asyncio.gather(service.parts.intake.accept(retry), service.parts.intake.accept(after))
        await session.wait_for("· Done after", count=1)
        await session.finish()
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        rows = db.execute(
            "select m.text from run_messages rm join runs r on r.id = rm.run_id"
            " join messages m on m.id = rm.message_id where r.status = 'succeeded'"
            " order by r.seq, rm.position"
        ).fetchall()
    assert [text for (text,) in rows] == ["first", "second"]


class _SlowStore(MemoryStore):
    """The memory store, with turns of the loop around each call an accept awaits: the
    interleavings a real store's latency makes, drawn by hypothesis. A message is
    recorded at once, as the SQL store queues it for its group commit before any wait."""

    def __init__(self, pauses: random.Random) -> None:
        super().__init__()
        self.pauses = pauses
        self.slow = False

    async def _pause(self) -> None:
        if self.slow:
            for _ in range(self.pauses.randint(0, 3)):
                await asyncio.sleep(0)

    async def accept(self, msg: InboundMessage, received_at: float) -> Message | None:
        accepted = await super().accept(msg, received_at)
        await self._pause()
        return accepted

    async def audit(self, entry: AuditEntry) -> None:
        await self._pause()
        await super().audit(entry)

    async def complete_command(self, message_id: MessageId) -> None:
        await self._pause()
        await super().complete_command(message_id)

    async def retryable_runs(self, room: RoomKey) -> list[RunRecord]:
        await self._pause()
        return await super().retryable_runs(room)

    async def requeue_run(self, run_id: RunId) -> list[Message]:
        await self._pause()
        return await super().requeue_run(run_id)

    async def mark_dropped(self, ids: Sequence[MessageId], actor: UserId | None, at: float) -> None:
        await self._pause()
        await super().mark_dropped(ids, actor, at)

    async def pending_message(
        self, room: RoomKey, external_id: ExternalMessageId
    ) -> Message | None:
        await self._pause()
        return await super().pending_message(room, external_id)

    async def edit_pending(
        self, message_id: MessageId, text: str, actor: UserId | None, at: float
    ) -> Message | None:
        await self._pause()
        return await super().edit_pending(message_id, text, actor, at)

    async def delete_pending(
        self, message_id: MessageId, actor: UserId | None, at: float
    ) -> Message | None:
        await self._pause()
        return await super().delete_pending(message_id, actor, at)


Event = tuple[str, int, int]
"""What a transport hands over: ("message" | "!stop" | "!retry" | "!reset", 0, delay)
or ("edit" | "delete", i, delay) of the i-th event (if a message); ``delay`` turns of
the loop before the call."""

EVENTS = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["message", "!stop", "!retry", "!reset"]), st.just(0), st.integers(0, 3)
        ),
        st.tuples(st.sampled_from(["edit", "delete"]), st.integers(0, 11), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=12,
)


def _expected(called: list[int], events: list[Event]) -> tuple[list[str], list[int]]:
    """The room's queue after ``events`` taken one by one in call order, and its length
    at each ``!reset``."""
    queue: list[str] = []
    texts: dict[str, str] = {}
    resets: list[int] = []
    retried = False
    for index in called:
        kind, target, _ = events[index]
        if kind == "message":
            queue.append(f"m{index}")
            texts[f"m{index}"] = f"m{index}"
        elif kind == "!stop":
            queue.clear()
        elif kind == "!retry" and not retried:
            queue.append("old")
            texts["old"] = "old"
            retried = True
        elif kind == "!reset":
            resets.append(len(queue))
        elif kind == "edit" and f"m{target}" in queue:
            texts[f"m{target}"] = f"m{target} edited"
        elif kind == "delete" and f"m{target}" in queue:
            queue.remove(f"m{target}")
    return [texts[key] for key in queue], resets


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(events=EVENTS, pauses=st.randoms(use_true_random=False))
def test_events_handed_over_at_once_take_effect_in_call_order(
    tmp_path: Path, events: list[Event], pauses: random.Random
) -> None:
    """Messages, commands, edits and deletions of one room accepted concurrently, each
    call after a random number of loop turns, the store's calls taking random turns too:
    the dispatcher's queue and the commands' effects are as if taken one by one, in
    the order of the calls."""
    settings_ = load_settings(write_config(tmp_path))
    user = UserId(settings_.console.user)
    answered: list[ExternalMessageId] = []
    queue_at_reset: list[int] = []

    async def scenario() -> None:
        store = _SlowStore(pauses)
        dispatcher = Dispatcher(DispatchLimits(1.0, 10.0, 100, 1), _never_runs)

        async def answer(message: Message, _text: str) -> None:
            answered.append(message.external_id)
            await store._pause()

        async def reset_session(room: RoomKey) -> None:
            queue_at_reset.append(dispatcher.status(room).waiting)
            await store._pause()

        commands = CommandHandler(dispatcher, store, "!", answer, reset_session)
        intake = Intake(settings_, store, dispatcher, commands, Metrics())
        # A failed run with one message, offered to ``!retry``.
        old = await store.accept(InboundMessage(ROOM, user, "old", ExternalMessageId("old")), 0.0)
        assert old is not None
        await store.start_run(RunId("r1"), Batch(ROOM, (old,)), 0.0)
        await store.finish_run(RunEnding(RunId("r1"), RunReport(RunStatus.FAILED), 0.0))
        store.slow = True
        called: list[int] = []

        async def hand_over(index: int, delay: int) -> None:
            for _ in range(delay):
                await asyncio.sleep(0)
            kind, target, _ = events[index]
            event: InboundEvent
            if kind == "edit":
                event = MessageEdited(ROOM, _ext(target), f"m{target} edited", user)
            elif kind == "delete":
                event = MessageDeleted(ROOM, _ext(target), user)
            else:
                text = f"m{index}" if kind == "message" else kind
                event = InboundMessage(ROOM, user, text, _ext(index))
            called.append(index)  # the accept's first step runs now, before its first wait
            await intake.accept(event)

        async with asyncio.TaskGroup() as group:
            for index, (_, _, delay) in enumerate(events):
                group.create_task(hand_over(index, delay))
        queue, resets = _expected(called, events)
        assert [m.text for m in dispatcher.stop(ROOM).dropped] == queue
        # Memory and store agree: what waits in the queue is what the store keeps
        # pending (in the store's order: the retried message was accepted first).
        recorded = ["old"] + [f"m{i}" for i in called]
        assert [m.text for m in await store.pending_messages()] == sorted(
            queue, key=lambda text: recorded.index(text.split()[0])
        )
        assert queue_at_reset == resets
        commands_called = [i for i in called if events[i][0].startswith("!")]
        assert answered == [_ext(i) for i in commands_called]  # answered in call order
        assert intake._order.rooms == 0  # nothing kept for a room with nothing under way

    asyncio.run(scenario())


def _ext(index: int) -> ExternalMessageId:
    return ExternalMessageId(f"ext-{index}")


async def _never_runs(_run: DispatchedRun) -> None:
    raise AssertionError("the dispatcher does not serve in this test")


async def test_a_message_is_handed_over_with_when_it_came_before_it_was_recorded(
    tmp_path: Path,
) -> None:
    """The window counts from a message's arrival: recording it (a disk sync, a slow
    database) is part of the user's wait, not added to it."""
    settings_ = load_settings(write_config(tmp_path))
    user = UserId(settings_.console.user)
    handed: list[tuple[str, float | None]] = []

    class _Timed(Dispatcher):
        clock = 100.0

        def now(self) -> float:
            return self.clock

        def submit(self, message: Message, arrived: float | None = None) -> None:
            handed.append((message.text, arrived))
            super().submit(message, arrived)

    dispatcher = _Timed(DispatchLimits(1.0, 10.0, 100, 1), _never_runs)

    class _Recording(MemoryStore):
        async def accept(self, inbound: InboundMessage, now: float) -> Message | None:
            dispatcher.clock += 0.25  # recording it takes a quarter of a second
            return await super().accept(inbound, now)

    store = _Recording()

    async def answer(_message: Message, _text: str) -> None:
        return None

    async def reset_session(_room: RoomKey) -> None:
        return None

    commands = CommandHandler(dispatcher, store, "!", answer, reset_session)
    intake = Intake(settings_, store, dispatcher, commands, Metrics())
    for text in ("first", "second"):
        inbound = InboundMessage(ROOM, user, text, ExternalMessageId(text))
        assert await intake.accept(inbound) is Accepted.ACCEPTED
    assert handed == [("first", 100.0), ("second", 100.25)]
    assert dispatcher.status(ROOM).waiting == 2

"""The end of a run never loses the answer: slow or rate-limited cosmetics,
bad text, a failing step, a failing store at the start of a run."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from bridge.config import load_settings
from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.transport import Accepted, Delivery, RateLimited
from bridge.store.base import RunEnding, Store, StoreError
from tests.bridge.harness import ConsoleSession, rows, write_config
from tests.bridge.log_seen import LogSeen
from tests.fakes.flaky_store import FlakyStore
from transports.console import ConsoleTransport

ROOM = RoomKey(TransportName("console"), RoomId("console"))
WAIT_S = 30.0
"""Generous: each wait ends on an event long before; the bound only turns a hang into a failure."""


class HangingEdits(ConsoleTransport):
    """Edits never return: a chat server that sits on a progress edit (or a slow reaction)."""

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        await asyncio.Event().wait()


class RateLimitedEdits(ConsoleTransport):
    """Every edit is answered with "too many requests, retry after a minute"."""

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        raise RateLimited("console", 60.0)


async def test_an_answer_is_not_held_up_by_a_hanging_progress_edit(tmp_path: Path) -> None:
    # The last edit hangs beside the room until the shutdown gives it up after this.
    settings = load_settings(write_config(tmp_path, {"delivery": {"drain_timeout_s": 0.2}}))
    async with ConsoleSession(settings, console=HangingEdits) as session:
        session.send("the answer")
        async with asyncio.timeout(WAIT_S):
            await session.wait_for("\nthe answer\n")
    assert rows(tmp_path, "select status from runs") == [("succeeded",)]
    assert rows(tmp_path, "select state from outbox") == [("delivered",)]


async def test_an_answer_survives_a_rate_limited_progress_edit(tmp_path: Path) -> None:
    # The "Done" edit waits for the budget, beside the room, until the shutdown
    # gives it up after this.
    settings = load_settings(write_config(tmp_path, {"delivery": {"drain_timeout_s": 0.2}}))
    async with ConsoleSession(settings, console=RateLimitedEdits) as session:
        session.send("the answer")
        async with asyncio.timeout(WAIT_S):
            await session.wait_for("\nthe answer\n")
        out = await session.finish()
    # Rate-limited: the cosmetic "Done" edit is given up, the answer is not.
    assert "· Done after" not in out
    assert rows(tmp_path, "select status from runs") == [("succeeded",)]
    assert rows(tmp_path, "select state from outbox") == [("delivered",)]


async def test_half_an_emoji_in_claudes_answer_does_not_wedge_the_room(tmp_path: Path) -> None:
    path = write_config(tmp_path, env={"FAKE_CLAUDE_CUT_EMOJI": "1"})
    async with ConsoleSession(load_settings(path)) as session:
        session.send("first")
        async with asyncio.timeout(WAIT_S):
            await session.wait_for("Done. \ufffd")
            session.send("second")
            await session.wait_for("Done. \ufffd", count=2)
    assert rows(tmp_path, "select status from runs") == [("succeeded",), ("succeeded",)]
    assert rows(tmp_path, "select distinct text from outbox") == [("Done. \ufffd",)]


async def test_half_an_emoji_from_chat_is_accepted_safely(tmp_path: Path) -> None:
    async with ConsoleSession(load_settings(write_config(tmp_path))) as session:
        assert session.service is not None
        cut = InboundMessage(ROOM, UserId("local"), "cut \ud83d", ExternalMessageId("x-1"))
        assert await session.service.parts.intake.accept(cut) is Accepted.ACCEPTED
        async with asyncio.timeout(WAIT_S):
            await session.wait_for("cut \ufffd")
    assert rows(tmp_path, "select text, state from messages") == [("cut \ufffd", "done")]


class FinishFailsOnce:
    """The real store, except that recording a run's end raises a bug's error once."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def finish_run(self, ending: RunEnding) -> Any:
        if not self.failed:
            self.failed = True
            raise RuntimeError("a bug at the end of the run")
        return await self._store.finish_run(ending)


async def two_runs(tmp_path: Path, wrap_store: type[FinishFailsOnce]) -> None:
    """Run "first", then "second" in the console room over a store that fails once."""
    settings = load_settings(write_config(tmp_path))
    async with ConsoleSession(settings, wrap_store=wrap_store) as session:
        assert session.service is not None
        session.service.parts.executor.store_retry_delays_s = (0.01,)
        session.send("first")
        async with asyncio.timeout(WAIT_S):
            await session.wait_for("\nfirst\n")
            session.send("second")
            await session.wait_for("\nsecond\n")


async def test_an_unexpected_error_at_the_end_still_records_and_frees_the_room(
    tmp_path: Path,
) -> None:
    await two_runs(tmp_path, FinishFailsOnce)
    assert rows(tmp_path, "select status from runs") == [("succeeded",), ("succeeded",)]
    assert rows(tmp_path, "select count(*) from outbox where state = 'delivered'") == [(2,)]


class FinishAckLost(FinishFailsOnce):
    """Recording a run's end commits, then the acknowledgement is lost once."""

    async def finish_run(self, ending: RunEnding) -> Any:
        entries = await self._store.finish_run(ending)
        if not self.failed:
            self.failed = True
            raise StoreError("connection lost after COMMIT")
        return entries


async def test_an_answer_whose_commit_was_not_acknowledged_goes_out_at_once(
    tmp_path: Path,
) -> None:
    # The retry finds the run ended and hands the recorded answer over: "first"
    # goes out before "second" is asked (two_runs waits for it).
    await two_runs(tmp_path, FinishAckLost)
    assert rows(tmp_path, "select text, state from outbox order by id") == [
        ("first", "delivered"),
        ("second", "delivered"),
    ]


class AnswerRateLimitedOnce(ConsoleTransport):
    """The server rate-limits the first answer (retry at once)."""

    limited = False

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        if reply.kind is ReplyKind.RESULT and not AnswerRateLimitedOnce.limited:
            AnswerRateLimitedOnce.limited = True
            raise RateLimited("console", 0.0)
        return await super().send(reply, delivery)


@pytest.mark.parametrize("failing", [("finish_run",), ("finish_run", "enqueue")])
async def test_an_answer_whose_outcome_cannot_be_recorded_survives_a_rate_limit(
    tmp_path: Path, failing: tuple[str, ...]
) -> None:
    """Outcome unrecorded: the answer goes into the outbox alone or, failing that,
    directly, and a rate limit does not drop it; the next start words it honestly."""
    flaky: list[FlakyStore] = []

    def wrap(store: Store) -> Store:
        flaky.append(FlakyStore(store))
        return flaky[0].store

    AnswerRateLimitedOnce.limited = False
    settings = load_settings(write_config(tmp_path))
    async with ConsoleSession(settings, wrap_store=wrap, console=AnswerRateLimitedOnce) as session:
        assert session.service is not None
        session.service.parts.executor.store_retry_delays_s = (0.01,)
        for method in failing:
            flaky[0].fail(method, times=None)
        session.send("precious")
        async with asyncio.timeout(WAIT_S):
            await session.wait_for("\nprecious\n")
    assert AnswerRateLimitedOnce.limited
    assert rows(tmp_path, "select status from runs") == [("running",)]
    async with ConsoleSession(settings) as again:
        async with asyncio.timeout(WAIT_S):
            text = await again.wait_for("If its answer is not above")
    assert "did not finish before chatbridge restarted" in text
    assert "was interrupted" not in text


async def test_a_failing_start_is_retried_in_order(tmp_path: Path) -> None:
    flaky: list[FlakyStore] = []

    def wrap(store: Store) -> Store:
        flaky.append(FlakyStore(store))
        return flaky[0].store

    settings = load_settings(write_config(tmp_path))
    async with ConsoleSession(settings, wrap_store=wrap) as session:
        assert session.service is not None
        session.service.parts.executor.start_retry_delays_s = (0.05,) * 4
        flaky[0].fail("start_run", times=3)
        session.send("first")
        async with asyncio.timeout(WAIT_S):
            await session.wait_for("the run starts as soon as it answers again")
            session.send("second")
            await session.wait_for("\nfirst\n")
            await session.wait_for("\nsecond\n")
    assert flaky[0].failures["start_run"] == 3
    out = session.out.getvalue()
    assert out.index("\nfirst\n") < out.index("\nsecond\n")
    texts = rows(
        tmp_path,
        "select group_concat(m.text) from runs r join messages m on m.run_id = r.id"
        " group by r.id order by r.seq",
    )
    assert texts == [("first",), ("second",)]


async def test_a_start_that_keeps_failing_is_told_and_kept_for_the_restart(
    tmp_path: Path,
) -> None:
    flaky: list[FlakyStore] = []

    def wrap(store: Store) -> Store:
        flaky.append(FlakyStore(store))
        return flaky[0].store

    settings = load_settings(write_config(tmp_path))
    async with ConsoleSession(settings, wrap_store=wrap) as session:
        assert session.service is not None
        session.service.parts.executor.start_retry_delays_s = (0.01, 0.01)
        flaky[0].fail("start_run", times=None)
        session.send("first")
        async with asyncio.timeout(WAIT_S):
            await session.wait_for("Your messages are kept and run when chatbridge restarts.")
    assert flaky[0].failures["start_run"] == 3
    assert rows(tmp_path, "select text, state from messages") == [("first", "pending")]

    # The next start runs it.
    async with ConsoleSession(load_settings(write_config(tmp_path))) as again:
        async with asyncio.timeout(WAIT_S):
            await again.wait_for("\nfirst\n")
    assert rows(tmp_path, "select state from messages") == [("done",)]


async def test_a_stop_after_claude_answered_keeps_the_answer_and_the_session(
    tmp_path: Path,
) -> None:
    """claude printed its result and lingers: a !stop stops it, the answer still goes out."""
    env = {"FAKE_CLAUDE_RESULT": "THE-ANSWER", "FAKE_CLAUDE_LINGER": "300"}
    # The runner would wait this long for the lingering claude to exit by itself.
    path = write_config(tmp_path, {"runner": {"stop_grace_s": 60.0}}, env=env)
    answered = LogSeen("claude printed its answer")
    runs_log = logging.getLogger("bridge.runs.executor")
    level = runs_log.level
    runs_log.setLevel(logging.INFO)
    runs_log.addHandler(answered)
    try:
        async with ConsoleSession(load_settings(path)) as session:
            session.send("compute it")
            async with asyncio.timeout(WAIT_S):
                await answered.seen.wait()
                session.send("!stop")
                await session.wait_for("Stopping the run of 1 message")
                await session.wait_for("\nTHE-ANSWER\n")
            await session.finish()
    finally:
        runs_log.removeHandler(answered)
        runs_log.setLevel(level)
    status, session_id, cost = rows(tmp_path, "select status, session_id, cost_usd from runs")[0]
    assert status == "succeeded"
    assert cost is not None
    assert session_id is not None
    assert rows(tmp_path, "select session_id from rooms") == [(session_id,)]
    assert rows(tmp_path, "select state from messages where text = 'compute it'") == [("done",)]

"""Budgets and usage limits through the running service: the console room, the fake
claude, SQLite (docs/budgets.md)."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from bridge.config import load_settings
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
from bridge.core.money import usd
from bridge.runs.budget import Budgets, day_start
from bridge.runs.usage import limit_text, usage_limit
from bridge.store.base import RunEnding, Store, StoreError
from bridge.store.memory import MemoryStore
from runner import UsageLimited
from tests.bridge.harness import ECHO, ConsoleSession, rows, write_config
from tests.bridge.live_runs import WAIT_S
from tests.config_files import Table
from tests.fakes.fake_claude import FAKE_CLAUDE
from tests.fakes.flaky_store import StoreWrapper

CONSOLE = RoomKey(TransportName("console"), RoomId("console"))
T = TypeVar("T")


async def test_costs_accumulate_until_the_room_budget_refuses_a_run(tmp_path: Path) -> None:
    config = {"defaults": {"daily_budget_usd": 0.5, "env": {**ECHO, "FAKE_CLAUDE_COST": "0.3"}}}
    settings = load_settings(write_config(tmp_path, config))
    async with ConsoleSession(settings) as session:
        session.send("first")
        await session.wait_for("first\n")
        session.send("!status")
        await session.wait_for("Spent today (UTC): $0.30 in this room of $0.50")
        session.send("second")  # 0.30 < 0.50: it starts, and brings the room to 0.60
        await session.wait_for("second\n")
        session.send("third")
        out = await session.wait_for("so it did not start")
        session.send("!status")
        out = await session.wait_for("Spent today (UTC): $0.60 in this room of $0.50")
        assert session.service is not None
        metrics = session.service.parts.metrics.exposition().decode()
        out = await session.finish()

    assert 'chatbridge_budget_refusals_total{budget="room"} 1.0' in metrics

    refused = re.search(r"The run failed: this room's daily budget is spent .*", out)
    assert refused is not None, out
    assert "($0.60 of $0.50 today)" in refused[0]
    assert "your messages are kept" in refused[0]
    assert "`!retry run-" in refused[0]
    assert out.count("daily budget is spent") == 1  # told once for the batch
    assert "third\n" not in out  # never ran
    runs = rows(tmp_path, "select status from runs order by seq")
    assert [r[0] for r in runs] == ["succeeded", "succeeded", "failed"]
    # The refused batch is kept, failed: !retry runs it after the reset.
    states = rows(tmp_path, "select text, state from messages where text = 'third'")
    assert states == [("third", "failed")]
    ledger = rows(tmp_path, "select transport, room_id, cost_usd from spend order by at")
    assert ledger == [("console", "console", 0.3), ("console", "console", 0.3)]


async def test_the_service_budget_covers_every_room_and_a_reset_keeps_the_spend(
    tmp_path: Path,
) -> None:
    config = {
        "budget": {"daily_usd": 0.25},
        "defaults": {"env": {**ECHO, "FAKE_CLAUDE_COST": "0.25"}},
    }
    settings = load_settings(write_config(tmp_path, config))
    async with ConsoleSession(settings) as session:
        session.send("first")
        await session.wait_for("first\n")
        session.send("!reset")
        await session.wait_for("The next run starts a new Claude session.")
        session.send("again")
        await session.wait_for("chatbridge's daily budget is spent ($0.25 of $0.25 today)")
        session.send("!status")
        out = await session.wait_for("in all rooms of $0.25.")
        out = await session.finish()
    assert "Spent today (UTC): $0.25 in this room, $0.25 in all rooms of $0.25." in out


async def test_a_run_at_its_cap_is_reported_and_its_cost_counted(tmp_path: Path) -> None:
    config = {"defaults": {"max_budget_usd": 0.1, "env": {**ECHO, "FAKE_CLAUDE_COST": "0.12"}}}
    settings = load_settings(write_config(tmp_path, config))
    async with ConsoleSession(settings) as session:
        session.send("spend")
        await session.wait_for("its spending cap")
        session.send("!status")
        out = await session.wait_for("Each run may spend $0.10.")
        assert session.service is not None
        metrics = session.service.parts.metrics.exposition().decode()
        out = await session.finish()
    assert (
        "The run failed: it reached its spending cap of $0.10 (max_budget_usd) after"
        " spending $0.12. `!retry run-" in out
    )
    assert "Spent today (UTC): $0.12 in this room" in out
    assert 'chatbridge_room_cost_usd_total{room="console",transport="console"} 0.12' in metrics


async def test_usage_limit_tells_the_reset_and_resumes_once_after_a_restart(
    tmp_path: Path,
) -> None:
    once = tmp_path / "limited-once"
    env = {**ECHO, "FAKE_CLAUDE_USAGE_LIMIT": "4", "FAKE_CLAUDE_USAGE_LIMIT_ONCE": str(once)}
    config = {"runner": {"resume_after_limit": True}, "defaults": {"env": env}}
    settings = load_settings(write_config(tmp_path, config))
    async with ConsoleSession(settings) as session:
        session.send("big job")
        out = await session.wait_for("chatbridge retries this run then (once)")
        session.send("!status")
        out = await session.wait_for("Retried when the usage limit resets: `run-")
        # Stopped before the reset (4 s away, far more than a stop takes): the retry
        # is the next start's to make.
        out = await session.finish()
    notice = re.search(r"Claude's 5-hour usage limit was reached\. It resets at (.*?) UTC\.", out)
    assert notice is not None, out
    assert "big job\n" not in out
    waiting = rows(tmp_path, "select run_id from limit_resumes")
    assert len(waiting) == 1

    async with ConsoleSession(settings) as session:
        await session.wait_for(f"The usage limit has reset: retrying run `{waiting[0][0]}`.")
        out = await session.wait_for("big job\n")
        assert session.service is not None
        metrics = session.service.parts.metrics.exposition().decode()
        await session.finish()
    assert 'chatbridge_usage_limits_total{outcome="resumed"} 1.0' in metrics
    assert rows(tmp_path, "select run_id from limit_resumes") == []

    # A third start finds nothing left to retry: the batch ran once.
    async with ConsoleSession(settings) as session:
        session.send("!status")
        out = await session.wait_for("Spent today")
        await session.finish()
    assert "retrying run" not in out
    runs = rows(tmp_path, "select status from runs order by seq")
    assert [r[0] for r in runs] == ["failed", "succeeded"]


async def test_stop_and_reset_call_off_the_retry_after_the_usage_limit(tmp_path: Path) -> None:
    env = {**ECHO, "FAKE_CLAUDE_USAGE_LIMIT": "3600"}
    config = {"runner": {"resume_after_limit": True}, "defaults": {"env": env}}
    settings = load_settings(write_config(tmp_path, config))
    async with ConsoleSession(settings) as session:
        for command in ("!stop", "!reset"):
            session.send(f"job before {command}")
            await session.wait_for(
                "chatbridge retries this run then (once)", count=1 + (command == "!reset")
            )
            [(run_id,)] = rows(tmp_path, "select run_id from limit_resumes")
            session.send(command)
            await session.wait_for(f"Called off the retry after the usage limit of run `{run_id}`")
            assert rows(tmp_path, "select run_id from limit_resumes") == []
            session.send("!status")
            out = await session.wait_for("Spent today", count=1 + (command == "!reset"))
            assert f"Retried when the usage limit resets: `{run_id}`" not in out
        await session.finish()


async def test_without_resume_the_room_is_told_when_to_retry(tmp_path: Path) -> None:
    env = {**ECHO, "FAKE_CLAUDE_USAGE_LIMIT": "3600"}
    settings = load_settings(write_config(tmp_path, {"defaults": {"env": env}}))
    async with ConsoleSession(settings) as session:
        session.send("job")
        out = await session.wait_for("runs it again after that.")
        await session.finish()
    assert re.search(r"It resets at .* UTC\. `!retry run-[0-9a-f]+` runs it again after that", out)
    assert rows(tmp_path, "select run_id from limit_resumes") == []


async def test_spending_is_counted_by_utc_day(tmp_path: Path) -> None:
    midnight = 1_795_737_600.0  # 2026-11-27 00:00 UTC
    assert day_start(midnight) == midnight
    assert day_start(midnight - 1) == midnight - 86400
    config = {"defaults": {"daily_budget_usd": 1.0}, "budget": {"daily_usd": 3.0}}
    settings = load_settings(write_config(tmp_path, config))
    store = MemoryStore()
    message = await store.accept(
        InboundMessage(CONSOLE, UserId("local"), "hi", ExternalMessageId("e1")), midnight - 7200
    )
    assert message is not None
    await store.start_run(RunId("run-1"), Batch(CONSOLE, (message,)), midnight - 3700)
    await store.finish_run(
        RunEnding(RunId("run-1"), RunReport(RunStatus.SUCCEEDED, cost_usd=1.0), midnight - 3600)
    )
    clock = [midnight - 1800]
    budgets = Budgets(settings, store, lambda: clock[0])
    refusal = await budgets.refusal(CONSOLE)
    assert refusal is not None
    assert refusal[0] == "room"
    assert "($1.00 of $1.00 today)" in refusal[1]
    assert "resets at 2026-11-27 00:00 UTC" in refusal[1]
    assert await budgets.status_lines(CONSOLE) == [
        "Spent today (UTC): $1.00 in this room of $1.00, $1.00 in all rooms of $3.00."
    ]
    clock[0] = midnight  # a new UTC day: yesterday's spending no longer counts
    assert await budgets.refusal(CONSOLE) is None
    assert await budgets.status_lines(CONSOLE) == [
        "Spent today (UTC): $0.00 in this room of $1.00, $0.00 in all rooms of $3.00."
    ]
    assert usd(0.004) == "$0.0040"
    assert usd(12.5) == "$12.50"


async def test_a_room_over_budget_gets_no_prestarted_claude(tmp_path: Path) -> None:
    spawns = tmp_path / "spawns"
    launcher = tmp_path / "claude"
    launcher.write_text(
        f'#!/bin/sh\necho x >> "{spawns}"\nexec "{sys.executable}" "{FAKE_CLAUDE}" "$@"\n'
    )
    launcher.chmod(0o755)
    config = {
        "runner": {"claude_bin": launcher, "prestart": True},
        "defaults": {"daily_budget_usd": 0.2, "env": {**ECHO, "FAKE_CLAUDE_COST": "0.3"}},
    }
    settings = load_settings(write_config(tmp_path, config))
    async with ConsoleSession(settings) as session:
        session.send("first")
        await session.wait_for("first\n")
        await session.wait_for("· Done after")  # the room is idle again: "second" opens a batch
        session.send("second")
        await session.wait_for("so it did not start")
        await session.finish()
    # The first run's claude (prestarted or not); none for the batch over budget.
    assert spawns.read_text().count("x") == 1


def test_usage_limits_from_the_event_or_an_older_claudes_text() -> None:
    seen = UsageLimited(1_795_715_804.0, "five_hour")
    assert usage_limit(seen, "anything") is seen
    assert usage_limit(None, "Claude AI usage limit reached|1795715804") == UsageLimited(
        1_795_715_804.0, ""
    )
    assert usage_limit(None, "API Error: Request rejected (429) · rate limited") is None


def test_the_limit_notice_names_the_limit_the_reset_and_the_retry() -> None:
    run = RunId("run-1")
    limited = UsageLimited(1_795_715_804.0, "seven_day")
    assert limit_text(limited, run, "!", resumes=True) == (
        "Claude's weekly usage limit was reached. It resets at 2026-11-26 17:56 UTC."
        " chatbridge retries this run then (once); `!retry run-1` runs it before."
    )
    assert limit_text(UsageLimited(None, "mystery"), run, "!", resumes=False) == (
        "Claude's usage limit was reached. `!retry run-1` runs it again once the limit has reset."
    )


class _SpendFails(MemoryStore):
    async def spend(self, since: float, room: RoomKey | None = None) -> float:
        raise StoreError("database is locked")


async def test_a_store_that_cannot_say_lets_the_run_start(tmp_path: Path) -> None:
    config = {"defaults": {"daily_budget_usd": 1.0}}
    budgets = Budgets(load_settings(write_config(tmp_path, config)), _SpendFails())
    assert await budgets.refusal(CONSOLE) is None
    assert await budgets.status_lines(CONSOLE) == ["Spent today: unknown (the database failed)."]


class RetryAtStop(StoreWrapper):
    """Wraps the store: the retry after a usage limit, fired at the reset, stops at its
    re-queue until ``!stop`` calls the retry off (``drop_limit_resume``): the two race."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.reached = asyncio.Event()
        self.called_off = asyncio.Event()
        self.done = asyncio.Event()

    async def drop_limit_resume(self, run_id: RunId) -> bool:
        dropped = await self.inner.drop_limit_resume(run_id)
        self.called_off.set()
        return dropped

    async def requeue_run(self, run_id: RunId) -> list[Message]:
        return await self._raced(self.inner.requeue_run(run_id))

    async def requeue_limit_resume(self, run_id: RunId) -> list[Message] | None:
        return await self._raced(self.inner.requeue_limit_resume(run_id))

    async def _raced(self, requeue: Awaitable[T]) -> T:
        self.reached.set()
        await self.called_off.wait()
        try:
            return await requeue
        finally:
            self.done.set()


async def test_a_limit_retry_firing_at_a_stop_is_either_called_off_or_stopped(
    tmp_path: Path,
) -> None:
    """Found in the review of issue 25's run endings."""
    once = tmp_path / "limited-once"
    env = {"FAKE_CLAUDE_USAGE_LIMIT": "1", "FAKE_CLAUDE_USAGE_LIMIT_ONCE": str(once)}
    config: Table = {"runner": {"resume_after_limit": True}}
    raced: list[RetryAtStop] = []

    def wrap(store: Store) -> Store:
        raced.append(RetryAtStop(store))
        return raced[0].store

    settings = load_settings(write_config(tmp_path, config, env={**ECHO, **env}))
    async with asyncio.timeout(WAIT_S), ConsoleSession(settings, wrap_store=wrap) as bridge:
        assert bridge.service is not None
        bridge.send("the job tok-L")
        await bridge.wait_for("chatbridge retries this run then (once)")
        await raced[0].reached.wait()  # the reset came: the retry is being made
        bridge.send("!stop")
        out = await bridge.wait_for("Called off the retry after the usage limit")
        await raced[0].done.wait()
        await bridge.service.parts.dispatcher.wait_idle()
        out = await bridge.finish()
    # Told it was called off, the room must not see it run (nor its answer).
    assert out.count("the job tok-L\n") == 0
    assert rows(tmp_path, "select status from runs order by seq") == [("failed",)]

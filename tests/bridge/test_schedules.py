"""``[[schedules]]`` against the real service: console room, fake claude, an injected clock.

The scheduler's clock is a :class:`ManualClock` set to wall-clock epoch
seconds; each test moves it to a firing time and waits until the scheduler
has dealt with that time (:meth:`CronSchedules.settled`), then looks at what the
room shows and what the metrics counted. Nothing sleeps real minutes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.automation.schedules import CronSchedules, WallClock
from bridge.config import Settings, load_settings
from bridge.core.model import InboundMessage
from bridge.core.transport import Accepted
from bridge.errors import ConfigError
from bridge.metrics import Metrics
from bridge.store.memory import MemoryStore
from dispatcher import ManualClock, TimerHandle
from tests.bridge.harness import ECHO, ConsoleSession, write_config
from tests.config_files import Table

WAIT_S = 30.0
NINE = dt.datetime(2026, 11, 26, 9, 0, tzinfo=dt.UTC).timestamp()
"""A firing of the daily schedule below (09:00 UTC)."""
ANSWER = "schedule:daily wrote:\n> summarize the open issues"
"""The fake claude echoes its prompt: the firing's answer, as the room shows it."""


def schedule(**more: Any) -> Table:
    return {
        "room": "console:console",
        "cron": "0 9 * * *",
        "prompt": "summarize the open issues",
        "name": "daily",
        **more,
    }


def config(tmp_path: Path, *schedules: Table, env: dict[str, str] = ECHO, **extra: Any) -> Settings:
    table: Table = {"schedules": list(schedules or [schedule()]), **extra}
    return load_settings(write_config(tmp_path, table, env=env))


def counted(session: ConsoleSession, outcome: str) -> float:
    assert session.service is not None
    value = session.service.parts.metrics.registry.get_sample_value(
        "chatbridge_schedule_firings_total", {"outcome": outcome}
    )
    return value or 0.0


def scheduler(session: ConsoleSession) -> CronSchedules:
    assert session.service is not None
    return session.service.parts.scheduler


async def at_time(session: ConsoleSession, clock: ManualClock, when: float) -> None:
    """Move the clock to ``when`` and wait until the scheduler has dealt with it."""
    clock.advance_to(when)
    await scheduler(session).settled(when)


def marks(tmp_path: Path) -> dict[str, float]:
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        return dict(db.execute("SELECT name, fired_at FROM schedule_marks").fetchall())


def schedule_messages(tmp_path: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        rows = db.execute(
            "SELECT external_id, sender, state FROM messages WHERE external_id LIKE 'schedule:%'"
            " ORDER BY id"
        )
        return [tuple(row) for row in rows.fetchall()]


def not_run(tmp_path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        rows = db.execute(
            "SELECT actor, detail FROM audit WHERE action = 'schedule_not_run' ORDER BY id"
        )
        return [(row[0], row[1]) for row in rows.fetchall()]


async def test_a_firing_runs_and_its_answer_is_posted(tmp_path: Path) -> None:
    clock = ManualClock(NINE - 90)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(config(tmp_path), schedule_clock=clock) as session:
            await scheduler(session).settled(NINE - 90)
            await at_time(session, clock, NINE - 1)
            assert counted(session, "fired") == 0
            await at_time(session, clock, NINE)
            assert counted(session, "fired") == 1
            await session.wait_for(ANSWER)
        out = await session.finish()
    assert out.count(ANSWER) == 1
    assert schedule_messages(tmp_path) == [
        ("schedule:daily:2026-11-26T09:00:00Z", "schedule:daily", "done")
    ]
    assert marks(tmp_path) == {"daily": NINE}


async def test_status_shows_the_next_firing_in_the_schedules_zone(tmp_path: Path) -> None:
    settings = config(tmp_path, schedule(timezone="Europe/Berlin"))
    clock = ManualClock(NINE)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, schedule_clock=clock) as session:
            await scheduler(session).settled(NINE)
            session.send("!status")
            out = await session.wait_for("Schedule `daily`")
    assert "Schedule `daily` (`0 9 * * *`): next at 2026-11-27 09:00 CET." in out


async def test_a_restart_does_not_fire_the_same_time_again(tmp_path: Path) -> None:
    """Also when the mark was not written (a crash right after the firing was recorded,
    or a second replica): the store refuses the firing's message the second time."""
    settings = config(tmp_path)
    clock = ManualClock(NINE - 30)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, schedule_clock=clock) as session:
            await scheduler(session).settled(NINE - 30)
            await at_time(session, clock, NINE)
            await session.wait_for(ANSWER)
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        db.execute("UPDATE schedule_marks SET fired_at = ?", (NINE - 30,))
    clock = ManualClock(NINE + 60)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, schedule_clock=clock) as again:
            await scheduler(again).settled(NINE + 60)
            assert counted(again, "duplicate") == 1
            assert counted(again, "fired") == 0
        out = await again.finish()
    assert ANSWER not in out
    assert len(schedule_messages(tmp_path)) == 1
    assert marks(tmp_path) == {"daily": NINE}


async def test_a_firing_missed_while_down_runs_once_at_start(tmp_path: Path) -> None:
    # Hourly; down from 08:30 to 09:40 with a catch-up of an hour: 09:00 runs at start.
    settings = config(tmp_path, schedule(cron="0 * * * *"), schedule={"catch_up_s": 3600})
    clock = ManualClock(NINE - 1800)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, schedule_clock=clock) as session:
            await scheduler(session).settled(NINE - 1800)
    clock = ManualClock(NINE + 2400)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, schedule_clock=clock) as again:
            await scheduler(again).settled(NINE + 2400)
            assert counted(again, "fired") == 1
            await again.wait_for(ANSWER)
            await at_time(again, clock, NINE + 3599)  # nothing more until 10:00
        out = await again.finish()
    assert out.count(ANSWER) == 1
    assert [m[0] for m in schedule_messages(tmp_path)] == ["schedule:daily:2026-11-26T09:00:00Z"]


async def test_several_missed_firings_run_once_as_the_latest(tmp_path: Path) -> None:
    settings = config(tmp_path, schedule(cron="0 * * * *"), schedule={"catch_up_s": 4 * 3600})
    clock = ManualClock(NINE - 1800)
    async with ConsoleSession(settings, schedule_clock=clock) as session:
        await scheduler(session).settled(NINE - 1800)
    clock = ManualClock(NINE + 3 * 3600 + 60)  # 09:00, 10:00, 11:00, 12:00 missed
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, schedule_clock=clock) as again:
            await scheduler(again).settled(NINE + 3 * 3600 + 60)
            assert counted(again, "fired") == 1
            await again.wait_for(ANSWER)
    assert [m[0] for m in schedule_messages(tmp_path)] == ["schedule:daily:2026-11-26T12:00:00Z"]


async def test_a_firing_missed_longer_ago_than_catch_up_is_skipped(tmp_path: Path) -> None:
    settings = config(tmp_path, schedule={"catch_up_s": 600})
    clock = ManualClock(NINE - 60)
    async with ConsoleSession(settings, schedule_clock=clock) as session:
        await scheduler(session).settled(NINE - 60)
    clock = ManualClock(NINE + 601)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, schedule_clock=clock) as again:
            await scheduler(again).settled(NINE + 601)
            assert counted(again, "missed") == 1
            assert counted(again, "fired") == 0
        out = await again.finish()
    assert ANSWER not in out
    assert schedule_messages(tmp_path) == []
    assert marks(tmp_path) == {"daily": NINE + 601}
    missed = ("schedule:daily", "2026-11-26T09:00:00Z missed: older than schedule.catch_up_s")
    assert not_run(tmp_path) == [missed]


async def test_a_late_wake_while_running_still_fires(tmp_path: Path) -> None:
    """catch_up_s = 0 means no catching up after a restart, not missing a firing
    because the loop woke a moment after it."""
    settings = config(tmp_path, schedule={"catch_up_s": 0})
    clock = ManualClock(NINE - 60)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, schedule_clock=clock) as session:
            await scheduler(session).settled(NINE - 60)
            await at_time(session, clock, NINE + 5)
            assert counted(session, "fired") == 1
            await session.wait_for(ANSWER)


async def test_a_new_schedule_does_not_fire_for_times_before_it_existed(tmp_path: Path) -> None:
    clock = ManualClock(NINE + 60)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(config(tmp_path), schedule_clock=clock) as session:
            await scheduler(session).settled(NINE + 60)
            assert counted(session, "fired") == 0
    assert marks(tmp_path) == {"daily": NINE + 60}


@pytest.mark.parametrize(("when_busy", "runs"), [("skip", 0), ("queue", 1)])
async def test_when_busy(tmp_path: Path, when_busy: str, runs: int) -> None:
    go = tmp_path / "go"
    env = {**ECHO, "FAKE_CLAUDE_WAIT_FOR": str(go)}
    settings = config(tmp_path, schedule(when_busy=when_busy), env=env)
    clock = ManualClock(NINE - 60)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, schedule_clock=clock) as session:
            await scheduler(session).settled(NINE - 60)
            session.send("a long task")
            await session.wait_for("echo hello")  # its run is under way
            await at_time(session, clock, NINE)
            assert counted(session, "skipped") == (1 if when_busy == "skip" else 0)
            assert counted(session, "fired") == runs
            go.touch()
        out = await session.finish()
    assert out.count(ANSWER) == runs
    assert "\na long task\n" in out  # the run that kept the room busy answered
    skipped = [("schedule:daily", "2026-11-26T09:00:00Z skipped: the room is busy")]
    assert not_run(tmp_path) == (skipped if when_busy == "skip" else [])


async def test_the_scheduler_stops_with_the_service(tmp_path: Path) -> None:
    clock = ManualClock(NINE - 60)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(config(tmp_path), schedule_clock=clock) as session:
            await scheduler(session).settled(NINE - 60)
            tasks = {t.get_name() for t in asyncio.all_tasks()}
            assert "schedules" in tasks
        await session.finish()
    assert "schedules" not in {t.get_name() for t in asyncio.all_tasks()}


class _SoonClock(WallClock):
    """The real clock and timers, shifted so that the next minute is half a second away."""

    def __init__(self) -> None:
        self.offset = 59.5 - time.time() % 60

    def now(self) -> float:
        return time.time() + self.offset

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return super().call_at(when - self.offset, callback)


async def test_real_timers_fire_an_every_minute_schedule(tmp_path: Path) -> None:
    """The loop's own sleeping on real timers (no manual clock): fires once, on time."""
    clock = _SoonClock()
    settings = config(tmp_path, schedule(cron="* * * * *"))
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, schedule_clock=clock) as session:
            await session.wait_for(ANSWER)
            assert counted(session, "fired") == 1
            assert clock.now() % 60 < 30  # it fired at the minute, not at a later nap


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (schedule(cron="0 9 * *"), "schedules[0].cron: '0 9 * *' has 4 field(s)"),
        (schedule(cron="0 25 * * *"), "schedules[0].cron: hour: 25 is not within 0-23"),
        (schedule(timezone="Europe/Atlantis"), "'Europe/Atlantis' is not an IANA time zone"),
        (schedule(room="slack:C1"), "schedules[0].room: slack:C1 is not a configured room"),
        (schedule(room="nowhere"), "'nowhere' is not a room: write transport:id"),
        (schedule(when_busy="later"), "schedules[0].when_busy"),
        (schedule(name="has space"), "schedules[0].name"),
    ],
)
def test_bad_schedules_are_configuration_errors(tmp_path: Path, entry: Table, error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(write_config(tmp_path, {"schedules": [entry]}))
    assert error in str(raised.value)


def test_schedule_names_are_unique(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("name(s) daily used twice")):
        load_settings(
            write_config(tmp_path, {"schedules": [schedule(), schedule(cron="0 * * * *")]})
        )


async def test_two_replicas_on_one_store_fire_once(tmp_path: Path) -> None:
    """Two schedulers (as two chatbridges would run them) on one store and one clock:
    the store's uniqueness of the firing's message lets exactly one of them in."""
    store = MemoryStore()
    settings = config(tmp_path)

    async def accept(message: InboundMessage) -> Accepted:
        recorded = await store.accept(message, NINE)
        return Accepted.DUPLICATE if recorded is None else Accepted.ACCEPTED

    clock = ManualClock(NINE - 60)
    metrics = Metrics()
    replicas = [
        CronSchedules(settings.schedules, store, accept, lambda _room: False, metrics, 3600, clock)
        for _ in range(2)
    ]
    async with asyncio.timeout(WAIT_S), asyncio.TaskGroup() as tasks:
        running = [tasks.create_task(r.run()) for r in replicas]
        for replica in replicas:
            await replica.settled(NINE - 60)
        clock.advance_to(NINE)
        for replica in replicas:
            await replica.settled(NINE)
        for task in running:
            task.cancel()
    fired = metrics.registry.get_sample_value(
        "chatbridge_schedule_firings_total", {"outcome": "fired"}
    )
    duplicate = metrics.registry.get_sample_value(
        "chatbridge_schedule_firings_total", {"outcome": "duplicate"}
    )
    assert (fired, duplicate) == (1, 1)
    pending = await store.pending_messages()
    assert [m.external_id for m in pending] == ["schedule:daily:2026-11-26T09:00:00Z"]
    assert await store.schedule_marks() == {"daily": NINE}


async def test_in_a_room_of_threads_firings_share_the_room_wide_conversation(
    tmp_path: Path,
) -> None:
    """A firing has no thread to open: it runs in the room-wide conversation, so
    a schedule's firings resume one session (not one new thread each)."""
    settings = config(tmp_path, schedule(cron="0 * * * *"), defaults={"conversation": "thread"})
    clock = ManualClock(NINE - 90)
    async with asyncio.timeout(WAIT_S):
        async with ConsoleSession(settings, schedule_clock=clock) as session:
            await scheduler(session).settled(NINE - 90)
            await at_time(session, clock, NINE)
            await session.wait_for(ANSWER)
            await at_time(session, clock, NINE + 3600)
            await session.wait_for(ANSWER, count=2)
        await session.finish()
    with sqlite3.connect(tmp_path / "bridge.db") as db:
        runs = db.execute("SELECT room_id, session_id FROM runs ORDER BY seq").fetchall()
    assert [room for room, _ in runs] == ["console", "console"]
    assert runs[0][1] == runs[1][1]

"""``[[schedules]]``: prompts that fire on a cron schedule, one loop for all of them.

Each firing is a message in the durable inbox (:mod:`bridge.core.synthetic`) named by its
schedule and scheduled time, so it never fires twice (restart, second replica). Each
schedule's *mark* says what it has dealt with; a firing missed while down runs once if at most
``catch_up_s`` old. Time comes from an injected clock, so tests wait no real minutes
(docs/automation.md, "Schedules").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol
from zoneinfo import ZoneInfo

from bridge.automation.config import ScheduleConfig
from bridge.automation.cron import CronExpr, local_text, utc_iso, zone_named
from bridge.core.model import InboundMessage, RoomKey, UserId
from bridge.core.synthetic import SCHEDULE, schedule_message
from bridge.core.transport import Accepted
from bridge.metrics import Metrics
from bridge.store.base import AuditAction, AuditEntry, AuditStore, ScheduleStore, StoreError
from dispatcher import Clock, TimerHandle

log = logging.getLogger(__name__)

NAP_S = 60.0
"""Longest sleep: the wall clock may be set or jump (NTP, suspend): it is read this often."""
RETRY_S = 30.0
"""Pause after the store failed before the firing is tried again."""


class Outcome(StrEnum):
    FIRED = "fired"
    """Recorded in the room's inbox; it runs like a message."""
    DUPLICATE = "duplicate"
    """Another process (or an earlier start) fired it already."""
    SKIPPED = "skipped"
    """``when_busy = "skip"`` and the room had a run or waiting messages."""
    MISSED = "missed"
    """Due while chatbridge was down, and older than ``catch_up_s`` at start."""


class WallClock:
    """The real clock: epoch seconds, and the running loop's timers."""

    def now(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(0.0, when - time.time()), callback)


@dataclass(slots=True)
class _Schedule:
    config: ScheduleConfig
    cron: CronExpr
    zone: ZoneInfo
    mark: float = 0.0

    @property
    def name(self) -> str:
        return self.config.key

    def next_after(self, instant: float) -> float:
        return self.cron.next_after(instant, self.zone)


class CronStore(AuditStore, ScheduleStore, Protocol):
    """The store's roles :class:`CronSchedules` uses."""


@dataclass(slots=True)
class CronSchedules:
    """Fires every schedule at its times; :meth:`run` until cancelled."""

    configs: Sequence[ScheduleConfig]
    store: CronStore
    accept: Callable[[InboundMessage], Awaitable[Accepted]]
    """The intake's entry for synthetic messages."""
    busy: Callable[[RoomKey], bool]
    """Whether a room has a run or waiting messages now."""
    metrics: Metrics
    catch_up_s: float
    clock: Clock = field(default_factory=WallClock)
    _schedules: list[_Schedule] = field(init=False, default_factory=list)
    _checked: float | None = field(init=False, default=None)
    """Clock time up to which every firing has been dealt with (set before each sleep)."""
    _progress: asyncio.Condition = field(init=False, default_factory=asyncio.Condition)

    def __post_init__(self) -> None:
        for config in self.configs:
            cron, zone = CronExpr.parse(config.cron), zone_named(config.timezone)
            self._schedules.append(_Schedule(config, cron, zone))

    async def run(self) -> None:
        """Load the marks, catch up, then fire on time; returns only by cancellation."""
        if not self._schedules:
            return
        while True:
            try:
                await self._load_marks()
                break
            except StoreError:
                log.warning("schedules: reading the marks failed; trying again", exc_info=True)
                await self._sleep_until(self.clock.now() + RETRY_S)
        while True:
            now = self.clock.now()
            try:
                for schedule in self._schedules:
                    await self._due(schedule, now)
            except StoreError:
                log.warning("schedules: the store failed; trying again", exc_info=True)
                await self._sleep_until(now + RETRY_S)
                continue
            async with self._progress:
                self._checked = now
                self._progress.notify_all()
            wake = min(s.next_after(s.mark) for s in self._schedules)
            await self._sleep_until(min(wake, now + NAP_S))

    async def settled(self, until: float) -> None:
        """Return once every firing due by clock time ``until`` has been dealt with (tests)."""
        async with self._progress:
            await self._progress.wait_for(
                lambda: self._checked is not None and self._checked >= until
            )

    def status_lines(self, room: RoomKey) -> list[str]:
        """The room's schedules and their next firing, for ``!status``."""
        lines = []
        now = self.clock.now()
        for schedule in self._schedules:
            if schedule.config.room_key != room:
                continue
            after = max(now, schedule.mark)
            when = local_text(schedule.next_after(after), schedule.zone)
            lines.append(f"Schedule `{schedule.name}` (`{schedule.cron.text}`): next at {when}.")
        return lines

    async def _load_marks(self) -> None:
        marks = await self.store.schedule_marks()
        now = self.clock.now()
        for schedule in self._schedules:
            mark = marks.get(schedule.name)
            if mark is None:
                # New: due from now on. Written, so a firing missed before the
                # next start is found then.
                await self.store.mark_schedule(schedule.name, now)
                mark = now
            schedule.mark = mark

    async def _due(self, schedule: _Schedule, now: float) -> None:
        """Deal with the schedule's firings due by ``now``: the latest runs, once."""
        first = schedule.next_after(schedule.mark)
        if first > now:
            return
        oldest_run = now - self.catch_up_s
        if self._checked is not None:
            # Due since the loop last looked: it was up, only late (timers, a busy
            # host, a suspend); catch_up_s is for what came due while chatbridge was down.
            oldest_run = min(oldest_run, self._checked)
        latest = None
        for firing in schedule.cron.firings(max(schedule.mark, oldest_run - 1), schedule.zone):
            if firing > now:
                break
            if firing >= oldest_run:
                latest = firing
        if latest is None:
            await self._not_run(schedule, Outcome.MISSED, first, "older than schedule.catch_up_s")
            await self.store.mark_schedule(schedule.name, now)
            schedule.mark = now
            return
        if first < latest:
            log.info(
                "schedule %s: firings before %s collapse into one", schedule.name, utc_iso(latest)
            )
        await self._fire(schedule, latest)
        await self.store.mark_schedule(schedule.name, latest)
        schedule.mark = latest

    async def _fire(self, schedule: _Schedule, at: float) -> None:
        config = schedule.config
        if config.when_busy == "skip" and self.busy(config.room_key):
            await self._not_run(schedule, Outcome.SKIPPED, at, "the room is busy")
            return
        message = schedule_message(config.room_key, schedule.name, utc_iso(at), config.prompt)
        accepted = await self.accept(message)
        if accepted is Accepted.DUPLICATE:
            self._count(schedule, Outcome.DUPLICATE, at, "fired already")
        else:
            self._count(schedule, Outcome.FIRED, at, "")

    async def _not_run(self, schedule: _Schedule, outcome: Outcome, at: float, why: str) -> None:
        """Audited (before the mark: a crash in between audits it again, never loses it)."""
        await self.store.audit(
            AuditEntry(
                AuditAction.SCHEDULE_NOT_RUN,
                self.clock.now(),
                room=schedule.config.room_key,
                actor=UserId(f"{SCHEDULE}{schedule.name}"),
                detail=f"{utc_iso(at)} {outcome.value}: {why}",
            )
        )
        self._count(schedule, outcome, at, why)

    def _count(self, schedule: _Schedule, outcome: Outcome, at: float, why: str) -> None:
        self.metrics.schedule_firings.labels(outcome.value).inc()
        level = logging.INFO if outcome is Outcome.FIRED else logging.WARNING
        if outcome is Outcome.DUPLICATE:
            level = logging.DEBUG
        log.log(
            level,
            "schedule %s at %s: %s%s",
            schedule.name,
            utc_iso(at),
            outcome.value,
            f" ({why})" if why else "",
        )

    async def _sleep_until(self, when: float) -> None:
        woken = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        handle = self.clock.call_at(when, wake)
        try:
            await woken
        finally:
            handle.cancel()

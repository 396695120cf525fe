"""Usage limits: a run cut short by the account's usage limit, and its retry once it resets.

A ``rate_limit_event`` rejected (:class:`runner.UsageLimited`) ends the turn; the room is told
when the limit resets. With ``[runner] resume_after_limit`` the run is retried then, once, as
``!retry`` would, also across restarts (``Store.add_limit_resume`` before the run's end;
:meth:`LimitResumes.serve` drops the record and re-queues in one transaction,
``Store.requeue_limit_resume``, so of a retry and a ``!stop`` or ``!reset`` calling it off,
one wins) (docs/budgets.md, "Usage limits").
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from bridge.core.model import Batch, Message, RoomKey, RunId, RunStatus
from bridge.metrics import Metrics
from bridge.outbound.notices import Notices
from bridge.store.base import (
    AuditAction,
    AuditEntry,
    AuditStore,
    LedgerStore,
    LimitResume,
    RunStore,
    StoreError,
)
from runner import UsageLimited

log = logging.getLogger(__name__)

STORE_RETRY_S = 30.0
"""After the store failed to list or make the waiting retries, the next try (also the
next look at a retry whose run's end was not recorded yet)."""

_LIMIT_NAMES = {
    "five_hour": "5-hour",
    "seven_day": "weekly",
    "seven_day_opus": "weekly Opus",
    "seven_day_sonnet": "weekly Sonnet",
    "overage": "extra usage",
}


_LEGACY = re.compile(r"Claude AI usage limit reached\|(\d{9,11})")
"""How claude 1.x said it in the result text, with the reset as epoch seconds."""


def usage_limit(seen: UsageLimited | None, result_text: str) -> UsageLimited | None:
    """The usage limit that ended a run: the ``rate_limit_event`` claude printed, or
    an older claude's ``Claude AI usage limit reached|<epoch>`` result text."""
    if seen is not None:
        return seen
    match = _LEGACY.search(result_text)
    return UsageLimited(float(match[1]), "") if match else None


def when(resets_at: float) -> str:
    """A reset time as the room reads it (UTC, to the minute)."""
    return f"{datetime.fromtimestamp(resets_at, UTC):%Y-%m-%d %H:%M} UTC"


def limit_text(limited: UsageLimited, run_id: RunId, prefix: str, resumes: bool) -> str:
    """What the room is told about a run the usage limit cut short."""
    name = _LIMIT_NAMES.get(limited.limit, "")
    text = f"Claude's {name + ' ' if name else ''}usage limit was reached."
    if limited.resets_at is None:
        return f"{text} `{prefix}retry {run_id}` runs it again once the limit has reset."
    text += f" It resets at {when(limited.resets_at)}."
    if resumes:
        return (
            f"{text} chatbridge retries this run then (once); `{prefix}retry {run_id}`"
            " runs it before."
        )
    return f"{text} `{prefix}retry {run_id}` runs it again after that."


class LimitResumeStore(RunStore, LedgerStore, AuditStore, Protocol):
    """The store's roles :class:`LimitResumes` uses."""


@dataclass(slots=True)
class LimitResumes:
    """The retries waiting for a usage limit to reset, made at their time."""

    store: LimitResumeStore
    submit: Callable[[Message], None]
    """Hands a re-queued message to the dispatcher (as ``!retry`` does)."""
    notices: Notices
    metrics: Metrics
    enabled: bool
    """``[runner] resume_after_limit``."""
    prefix: str = "!"
    wall_clock: Callable[[], float] = time.time
    configured: Callable[[RoomKey], bool] = field(default=lambda room: True)
    """Whether chatbridge serves the room now: a room taken out of the config keeps its
    retry waiting (as its pending messages at a restart), made if the room comes back."""
    owns: Callable[[RoomKey], bool] = field(default=lambda room: True)
    """With replicas: only the conversation's owner makes its retry (docs/replicas.md)."""
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def limited(self, run_id: RunId, batch: Batch, limited: UsageLimited) -> str:
        """A run ended cut short by ``limited``: note its retry (before the run's end is
        recorded) and return what the room is told."""
        self.metrics.usage_limits.labels("limited").inc()
        # A reset already past (a clock off, a stale window) is not waited for: the
        # retry would come at once, hit the limit again with the same past reset, and
        # be retried again, round after round. `!retry` is offered instead.
        resumes = (
            self.enabled and limited.resets_at is not None and limited.resets_at > self.wall_clock()
        )
        if resumes and limited.resets_at is not None:
            try:
                await self.store.add_limit_resume(run_id, batch.room, limited.resets_at)
            except StoreError:
                log.warning("could not note the retry after the usage limit", exc_info=True)
                resumes = False
        log.info("the run hit the usage limit (resets at %s)", limited.resets_at)
        return limit_text(limited, run_id, self.prefix, resumes)

    async def status_lines(self, room: RoomKey) -> list[str]:
        """``!status``'s line on the room's runs waiting for a usage limit to reset (those
        still offered: one the room moved past is not retried)."""
        try:
            offered = {r.id for r in await self.store.retryable_runs(room)}
            waiting = [w for w in await self.store.limit_resumes() if w.run_id in offered]
        except StoreError:
            return []
        if not waiting:
            return []
        runs = ", ".join(f"`{w.run_id}` at {when(w.resets_at)}" for w in waiting)
        return [f"Retried when the usage limit resets: {runs}."]

    async def call_off(self, room: RoomKey) -> list[RunId]:
        """``!stop`` or ``!reset`` in ``room``: its waiting retries are not made; the runs
        whose retry was called off (``!retry RUN`` still runs one, by hand)."""
        called_off = []
        for waiting in await self.store.limit_resumes():
            if waiting.room == room and await self.store.drop_limit_resume(waiting.run_id):
                called_off.append(waiting.run_id)
        if called_off:
            log.info("called off the retry after the usage limit of %s", called_off)
        return called_off

    def noted(self) -> None:
        """A retry was noted and its run's end recorded: :meth:`serve` looks again."""
        self._changed.set()

    async def serve(self) -> None:
        """Make each waiting retry at its time, for as long as the service runs."""
        if not self.enabled:
            return
        while True:
            self._changed.clear()
            try:
                listed = await self.store.limit_resumes()
                waiting = [w for w in listed if self.configured(w.room)]
                if len(waiting) < len(listed):
                    log.info(
                        "%d retry(s) after a usage limit wait for rooms no longer configured",
                        len(listed) - len(waiting),
                    )
                waiting = [w for w in waiting if self.owns(w.room)]
                now = self.wall_clock()
                due = [w for w in waiting if w.resets_at <= now]
                made = [await self._resume(entry) for entry in due]
            except Exception:
                # Never out of the service's task group: a retry waits, the service goes on.
                log.warning("could not make the retries after a usage limit", exc_info=True)
                await self._wait(STORE_RETRY_S)
                continue
            if any(made):
                continue
            later = [w.resets_at - now for w in waiting if w.resets_at > now]
            if due:
                # Runs whose end is not recorded yet (a reset time already past): their
                # end's noted() wakes this; the timeout is a backstop.
                later.append(STORE_RETRY_S)
            await self._wait(min(later) if later else None)

    async def _wait(self, delay: float | None) -> None:
        """Until ``delay`` has passed or a retry was noted."""
        try:
            async with asyncio.timeout(delay):
                await self._changed.wait()
        except TimeoutError:
            pass

    async def _resume(self, entry: LimitResume) -> bool:
        """Queue the run's messages again, then forget the retry (see the module's doc);
        False while the run's end is not recorded (nothing could be queued yet)."""
        run = await self.store.get_run(entry.run_id)
        if run is not None and run.status is RunStatus.RUNNING:
            return False
        messages = await self.store.requeue_limit_resume(entry.run_id)
        if messages is None:
            log.info("the retry of run %s after the usage limit was called off", entry.run_id)
            return True
        for message in messages:
            self.submit(message)
        if not messages:
            # Retried already (a !retry, or a process before this one), or no longer
            # offered (a later run of the room succeeded: it moved on): nothing runs.
            log.info("run %s is not offered any more; no retry after the usage limit", entry.run_id)
            return True
        self.metrics.usage_limits.labels("resumed").inc()
        await self._audit(entry.room, entry.run_id, len(messages))
        await self.notices.say(
            entry.room,
            f"The usage limit has reset: retrying run `{entry.run_id}`.",
            about=Batch(entry.room, tuple(messages)),
        )
        return True

    async def _audit(self, room: RoomKey, run_id: RunId, count: int) -> None:
        try:
            await self.store.audit(
                AuditEntry(
                    AuditAction.RETRY_REQUESTED,
                    self.wall_clock(),
                    room=room,
                    run_id=run_id,
                    detail=f"messages={count} after=usage_limit",
                )
            )
        except StoreError:
            log.warning("could not audit the retry after the usage limit", exc_info=True)

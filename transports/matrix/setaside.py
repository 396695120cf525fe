"""Events the service fails to take: retried a few times, then set aside, never dropped.

A failure is retried with the whole batch; an event that failed :data:`ATTEMPTS` times in a
row is saved to ``set_aside.json`` before the position moves past it, and offered again
with a backoff of its own (at once when the sink takes events again) until taken or
redacted (docs/deployment.md, "Matrix bot account" and "Inside the Matrix transport").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from nio import Event

from bridge.core.transport import InboundEvent, InboundSink, SinkClosed
from transports.matrix.state import SetAside, SetAsideFile

log = logging.getLogger(__name__)

ATTEMPTS = 5
"""Consecutive failures of one event before it is set aside."""
RETRY_FIRST_S = 30.0
RETRY_CAP_S = 3600.0

Translate = Callable[[str, object], Awaitable[InboundEvent | None]]
"""The inbound event of a readable event of a room (checks included), or None."""
Offer = tuple[str, object, InboundEvent]
"""An event to hand over: its room, the event itself, and what it carries."""


class SetAsideEvents:
    """Counts failures per event, and keeps the events that failed too often."""

    def __init__(self, file: SetAsideFile, clock: Callable[[], float] = time.time) -> None:
        self._file = file
        self._clock = clock
        self._failures: dict[str, int] = {}
        self._events = {e.event_id: e for e in file.load()}

    def __len__(self) -> int:
        return len(self._events)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._events

    async def offer(
        self, sink: InboundSink, room_id: str, event: object, inbound: InboundEvent
    ) -> None:
        """Hand ``inbound`` (of ``event``) to ``sink``; raise for a retry, or set it aside.

        :class:`SinkClosed` always propagates. Any other failure propagates
        (the caller retries the batch) until the event has failed
        :data:`ATTEMPTS` times; then the event is saved here and this returns.
        """
        await self.offer_together(sink, [(room_id, event, inbound)])

    async def offer_together(self, sink: InboundSink, offers: Sequence[Offer]) -> None:
        """Hand several events to ``sink`` at once, in order, like :meth:`offer` each.

        The sink is called for all of them concurrently, in this order, so
        its store can record them in one transaction (a group commit keeps
        the order of the calls); only messages, which start nothing before
        they are recorded, may go together. Failures are then handled in
        order, as if offered one by one: the first failing event is counted
        (its error propagates for a retry of the batch) or set aside, and the
        events after it that the sink took stay taken (a replay is dropped
        as a duplicate).
        """
        outcomes: list[BaseException | None] = []
        if len(offers) == 1:
            try:
                await sink(offers[0][2])
            except Exception as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
        else:
            taken = await asyncio.gather(*(sink(o[2]) for o in offers), return_exceptions=True)
            outcomes = [t if isinstance(t, BaseException) else None for t in taken]
        for (_, event, _), outcome in zip(offers, outcomes, strict=True):
            if outcome is None:
                self._failures.pop(str(getattr(event, "event_id", "")), None)
        if any(outcome is None for outcome in outcomes):
            self._wake()
        for outcome in outcomes:
            if isinstance(outcome, SinkClosed) or not isinstance(outcome, Exception | None):
                raise outcome  # closed, or cancelled: never counted as a refusal
        for (room_id, event, _), outcome in zip(offers, outcomes, strict=True):
            if outcome is not None:
                self._refused(room_id, event, outcome)

    def _refused(self, room_id: str, event: object, problem: BaseException) -> None:
        """Count a refusal of ``event``: raise ``problem`` for a retry, or set the event aside."""
        event_id = str(getattr(event, "event_id", ""))
        failures = self._failures.get(event_id, 0) + 1
        if failures < ATTEMPTS or not event_id:
            self._failures[event_id] = failures
            raise problem
        self._failures.pop(event_id, None)
        self._keep(room_id, event, problem)

    def forget(self, event_id: str) -> None:
        """Drop a set-aside event (it was redacted: it must not run later)."""
        self._failures.pop(event_id, None)
        if self._events.pop(event_id, None) is not None:
            log.info("matrix: the set-aside event %s was redacted; dropped", event_id)
            self._save()

    async def retry(self, sink: InboundSink, translate: Translate) -> None:
        """Offer the set-aside events that are due again, oldest first.

        One still refused stays, with a longer wait; it does not stop the others.
        """
        now = self._clock()
        changed = False
        try:
            for entry in sorted(self._events.values(), key=lambda e: e.first_failed):
                if entry.next_try > now:
                    continue
                event = _parse(entry)
                try:
                    inbound = await translate(entry.room_id, event) if event else None
                    if inbound is not None:
                        await sink(inbound)
                except SinkClosed:
                    raise
                except Exception as exc:
                    entry.failures += 1
                    entry.problem = f"{type(exc).__name__}: {exc}"
                    delay = min(
                        RETRY_CAP_S, RETRY_FIRST_S * 2 ** min(entry.failures - ATTEMPTS, 20)
                    )
                    entry.next_try = now + delay
                    changed = True
                    log.error(
                        "matrix: the set-aside event %s in %s was refused again (%s); "
                        "next try in %.0fs",
                        entry.event_id,
                        entry.room_id,
                        entry.problem,
                        delay,
                    )
                    continue
                log.warning("matrix: the set-aside event %s was taken at last", entry.event_id)
                del self._events[entry.event_id]
                changed = True
        finally:
            if changed:
                self._save()

    def _keep(self, room_id: str, event: object, problem: BaseException) -> None:
        source = getattr(event, "source", None)
        now = self._clock()
        entry = SetAside(
            room_id=room_id,
            source=dict(source) if isinstance(source, dict) else {},
            decrypted=bool(getattr(event, "decrypted", False)),
            first_failed=now,
            failures=ATTEMPTS,
            next_try=now + RETRY_FIRST_S,
            problem=f"{type(problem).__name__}: {problem}",
        )
        self._events[entry.event_id] = entry
        self._save()
        log.error(
            "matrix: the service refused event %s in %s %d times (%s); set aside in %s "
            "so the other events go on, and offered again later",
            entry.event_id,
            room_id,
            ATTEMPTS,
            entry.problem,
            "set_aside.json",
        )

    def _wake(self) -> None:
        """The sink takes events again: what waits here is due at once."""
        for entry in self._events.values():
            entry.next_try = 0.0

    def _save(self) -> None:
        self._file.save(list(self._events.values()))


def _parse(entry: SetAside) -> object | None:
    try:
        if entry.decrypted:
            event: object = Event.parse_decrypted_event(dict(entry.source))
        else:
            event = Event.parse_event(dict(entry.source))
    except (KeyError, TypeError, ValueError) as exc:
        log.error("matrix: the set-aside event %s cannot be read: %s", entry.event_id, exc)
        return None
    return event

"""The outbox worker: delivers recorded replies, in order per room, until they arrive.

A run's answer (or its failure notice) is recorded in the store together
with the run's outcome (:meth:`~bridge.store.base.Store.finish_run`) and then
handed here. The worker sends each entry through its room's transport with a
:class:`~bridge.core.transport.Delivery`, so that no part is posted twice:
the transport skips the parts already done and reports each part it posts,
which is recorded at once. On start it picks up every entry a crash or a
restart left undelivered.

Order and retries:

- A room's entries go strictly one after another, in recording order: an
  answer never overtakes an earlier one. Rooms are delivered in parallel.
- :class:`~bridge.core.transport.RateLimited`: wait what the server asked,
  then try the same entry again (and tell the pacing, so cosmetic updates
  back off too).
- :class:`~bridge.core.transport.Undeliverable`: give up on that entry (it is
  marked failed, logged and counted) and go on with the room's next one.
- Anything else (the server is down, the store failed to record a part):
  exponential backoff, then the same entry again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from bridge.core.model import ExternalMessageId, RoomKey, TransportName
from bridge.core.transport import Delivery, RateLimited, Undeliverable
from bridge.metrics import Metrics
from bridge.store.base import DeliveryState, OutboxEntry, Store, StoreError
from transports.backoff import Backoff
from transports.base import Transport

log = logging.getLogger(__name__)

RETRY_BASE_S = 1.0
RETRY_CAP_S = 300.0
FINISH_ATTEMPTS = 5
"""Tries to record that an entry was delivered before leaving it to the next start."""

Sleep = Callable[[float], Awaitable[None]]
RateLimitedHook = Callable[[TransportName, float], None]


def _ignore_rate_limit(transport: TransportName, retry_after_s: float) -> None:
    pass


@dataclass(slots=True)
class Outbox:
    """Delivers outbox entries; :meth:`serve` runs it, :meth:`submit` hands it work."""

    store: Store
    transports: Mapping[TransportName, Transport]
    metrics: Metrics
    on_rate_limited: RateLimitedHook = _ignore_rate_limit
    """Told about every rate limit a delivery met (the cosmetic pacing listens)."""
    clock: Callable[[], float] = time.time
    sleep: Sleep = asyncio.sleep
    retry_base_s: float = RETRY_BASE_S
    retry_cap_s: float = RETRY_CAP_S
    _queues: dict[RoomKey, deque[OutboxEntry]] = field(default_factory=dict)
    _known: set[int] = field(default_factory=set)
    _settled: dict[int, asyncio.Event] = field(default_factory=dict)
    _workers: asyncio.TaskGroup | None = None
    _running: set[RoomKey] = field(default_factory=set)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the start-up read is done and nothing is queued."""
    _loaded: bool = False
    _settled_before_load: set[int] = field(default_factory=set)
    """Entries settled while the start-up read was under way: that read may
    still list them as pending, and must not queue them again."""

    @property
    def pending(self) -> int:
        """Entries handed over and not yet delivered or given up."""
        return len(self._known)

    def submit(self, entries: Iterable[OutboxEntry]) -> Callable[[], Awaitable[None]]:
        """Queue entries for delivery; returns a wait for all of them to settle.

        Entries already queued are not queued twice (the start-up pick-up
        and a run's end may both hand over the same entry).
        """
        events = []
        for entry in entries:
            if entry.state is not DeliveryState.PENDING or entry.id in self._settled_before_load:
                continue
            events.append(self._settled.setdefault(entry.id, asyncio.Event()))
            if entry.id in self._known:
                continue
            self._known.add(entry.id)
            self._queues.setdefault(entry.reply.room, deque()).append(entry)
            self._idle.clear()
            self._start(entry.reply.room)

        async def settled() -> None:
            for event in events:
                await event.wait()

        return settled

    def _start(self, room: RoomKey) -> None:
        if self._workers is None or room in self._running:
            return
        try:
            self._workers.create_task(self._deliver_room(room), name=f"outbox {room}")
        except RuntimeError:
            # The service is failing and the worker stopping: the entry stays
            # recorded and is delivered after the restart.
            log.info("the outbox is stopping; %s's answers go out after the restart", room)
            return
        self._running.add(room)

    async def serve(self) -> None:
        """Deliver until cancelled, starting with what earlier runs left undelivered."""
        async with asyncio.TaskGroup() as workers:
            self._workers = workers
            try:
                for room in list(self._queues):
                    self._start(room)
                self.submit(await self._undelivered())
                self._loaded = True
                self._settled_before_load.clear()
                if not self._known:
                    self._idle.set()
                await asyncio.Event().wait()  # the room workers do the rest
            finally:
                self._workers = None

    async def _undelivered(self) -> list[OutboxEntry]:
        backoff = Backoff(self.retry_base_s, self.retry_cap_s)
        while True:
            try:
                return await self.store.undelivered()
            except StoreError:
                log.warning("could not read the outbox; trying again", exc_info=True)
            await self.sleep(backoff.next_delay())

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every queued entry to settle; True if they did.

        Entries left by earlier runs count too: the wait includes the start-up read.
        """
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            log.warning(
                "%d answer(s) not delivered within %gs; they are sent after the restart",
                self.pending,
                timeout_s,
            )
            return False
        return True

    async def _deliver_room(self, room: RoomKey) -> None:
        queue = self._queues[room]
        try:
            while queue:
                entry = queue[0]
                await self._deliver(entry)
                queue.popleft()
                self._known.discard(entry.id)
                if not self._loaded:
                    self._settled_before_load.add(entry.id)
                self._settled.pop(entry.id, asyncio.Event()).set()
        finally:
            self._running.discard(room)
            if not queue:
                del self._queues[room]
            if not self._known and self._loaded:
                self._idle.set()

    async def _deliver(self, entry: OutboxEntry) -> None:
        """Send ``entry`` until it is delivered or refused for good."""
        room = entry.reply.room
        backoff = Backoff(self.retry_base_s, self.retry_cap_s)
        parts_done = entry.parts_done

        async def part_sent(index: int, message_id: ExternalMessageId) -> None:
            nonlocal parts_done
            # Counted before it is recorded: a retry in this process never
            # repeats the part even if recording it failed.
            parts_done = max(parts_done, index + 1)
            await self.store.delivery_progress(entry.id, index + 1)

        while True:
            try:
                await self._send(entry, Delivery(entry.key, parts_done, part_sent))
            except Undeliverable as exc:
                log.error("gave up delivering a %s to %s: %s", entry.reply.kind.value, room, exc)
                self.metrics.deliveries.labels("failed").inc()
                await self._finish(entry, DeliveryState.FAILED)
                return
            except RateLimited as exc:
                delay = max(0.0, exc.retry_after_s)
                self.on_rate_limited(room.transport, delay)
                self.metrics.deliveries.labels("rate_limited").inc()
                log.info("delivery to %s rate limited; trying again in %gs", room, delay)
            except Exception:
                delay = backoff.next_delay()
                self.metrics.deliveries.labels("retried").inc()
                log.warning(
                    "could not deliver to %s; trying again in %.1fs", room, delay, exc_info=True
                )
            else:
                self.metrics.deliveries.labels("delivered").inc()
                await self._finish(entry, DeliveryState.DELIVERED)
                return
            try:
                await self.store.delivery_attempted(entry.id, self.clock() + delay)
            except StoreError:
                log.warning("could not record a delivery attempt", exc_info=True)
            await self.sleep(delay)

    async def _send(self, entry: OutboxEntry, delivery: Delivery) -> None:
        room = entry.reply.room
        transport = self.transports.get(room.transport)
        if transport is None:
            raise Undeliverable(room.transport, "no such transport is configured")
        await transport.send(entry.reply, delivery)

    async def _finish(self, entry: OutboxEntry, state: DeliveryState) -> None:
        backoff = Backoff(self.retry_base_s, self.retry_cap_s)
        for attempt in range(FINISH_ATTEMPTS):
            try:
                await self.store.delivery_finished(entry.id, state, self.clock())
            except StoreError:
                if attempt + 1 == FINISH_ATTEMPTS:
                    # The transport's idempotency key keeps a resend after the
                    # restart from posting it twice where the server supports it.
                    log.exception("could not record that outbox entry %d ended", entry.id)
                    return
                log.warning("could not record the end of a delivery; trying again")
            else:
                return
            await self.sleep(backoff.next_delay())

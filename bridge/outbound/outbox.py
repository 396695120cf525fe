"""The outbox worker: delivers recorded replies, in order per room, until they arrive.

Entries recorded with the run's outcome (``Store.finish_run``) are sent through the room's
transport with a :class:`~bridge.core.transport.Delivery`, so no part is posted twice; a
room's entries go strictly in recording order, rooms in parallel, retried (rate limit,
backoff) until delivered or refused for good; on start it picks up what was left. A room's
worker never ends the service (docs/operations.md, "Answers and rate limits").
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from bridge.core import stages
from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomKey, TransportName
from bridge.core.transport import Delivery, RateLimited, Transport, Undeliverable
from bridge.metrics import Metrics
from bridge.store.base import DeliveryState, OutboxEntry, OutboxStore
from transports.backoff import Backoff

log = logging.getLogger(__name__)

SETTLED_MEMORY = 10_000
"""How many settled entries the outbox remembers, against a stale read handing one over
again (reads are milliseconds old; this is thousands of answers)."""


RETRY_BASE_S = 1.0
RETRY_CAP_S = 300.0
FINISH_ATTEMPTS = 5
UNRECORDED_TRIES = 5
"""Tries of a reply the store could not record (see :meth:`Outbox.send_unrecorded`)."""
SEND_TIMEOUT_S = 120.0
"""One delivery attempt that takes longer is given up and retried (a hung server)."""
"""Tries to record that an entry was delivered before leaving it to the next start."""

Sleep = Callable[[float], Awaitable[None]]
RateLimitedHook = Callable[[TransportName, float], None]


def _ignore_rate_limit(transport: TransportName, retry_after_s: float) -> None:
    pass


def discard_copy(path: Path, key: str) -> None:
    """Remove a settled file post's copy, which sits alone in a directory named by the
    entry's key (bridge.runs.file_posts); a file anywhere else is not the outbox's to remove."""
    if path.parent.name != key:
        log.warning("not removing %s: not a copy made for outbox entry %s", path, key)
        return
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()


@dataclass(slots=True)
class Outbox:
    """Delivers outbox entries; :meth:`serve` runs it, :meth:`submit` hands it work."""

    store: OutboxStore
    transports: Mapping[TransportName, Transport]
    metrics: Metrics
    on_rate_limited: RateLimitedHook = _ignore_rate_limit
    """Told about every rate limit a delivery met (the cosmetic pacing listens)."""
    clock: Callable[[], float] = time.time
    sleep: Sleep = asyncio.sleep
    retry_base_s: float = RETRY_BASE_S
    retry_cap_s: float = RETRY_CAP_S
    send_timeout_s: float = SEND_TIMEOUT_S
    _queues: dict[RoomKey, list[OutboxEntry]] = field(default_factory=dict)
    """Each room's entries, sorted by id; the head is the one being delivered."""
    _known: set[int] = field(default_factory=set)
    _done: set[int] = field(default_factory=set)
    """Entries settled here lately (delivered or given up): never queued again."""
    _done_order: deque[int] = field(default_factory=deque)
    _settled: dict[int, asyncio.Event] = field(default_factory=dict)
    _workers: asyncio.TaskGroup | None = None
    _running: set[RoomKey] = field(default_factory=set)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the start-up read is done and nothing is queued."""
    _loaded: bool = False
    """The start-up read is done: until then no room worker starts."""
    owns: Callable[[RoomKey], bool] = lambda room: True
    """Whether this process delivers ``room``'s entries: with replicas, only the
    conversation's owner does (docs/replicas.md)."""
    _unconfigured: set[TransportName] = field(default_factory=set)
    """Transports whose entries were left pending (logged once each)."""

    @property
    def pending(self) -> int:
        """Entries handed over and not yet delivered or given up."""
        return len(self._known)

    def _remember_settled(self, entry_id: int) -> None:
        self._done.add(entry_id)
        self._done_order.append(entry_id)
        if len(self._done_order) > SETTLED_MEMORY:
            self._done.discard(self._done_order.popleft())

    def busy(self, room: RoomKey) -> bool:
        """Whether entries of ``room`` are queued or being delivered."""
        return room in self._queues

    def submit(self, entries: Iterable[OutboxEntry]) -> Callable[[], Awaitable[None]]:
        """Queue entries for delivery; returns a wait for all of them to settle.

        Entries already queued are not queued twice (the start-up pick-up
        and a run's end may both hand over the same entry). An entry for a
        transport not configured is left pending in the store, not waited for.
        """
        events = []
        for entry in entries:
            if entry.state is not DeliveryState.PENDING:
                continue
            room = entry.reply.room
            if room.transport not in self.transports:
                if room.transport not in self._unconfigured:
                    self._unconfigured.add(room.transport)
                    log.warning(
                        "answers for transport %s are kept pending: it is not configured",
                        room.transport,
                    )
                continue
            if entry.id in self._done:
                # Settled here since the caller read it as pending (a replica's
                # poll reads the store, then hands the entries over): nothing to wait for.
                continue
            events.append(self._settled.setdefault(entry.id, asyncio.Event()))
            if entry.id in self._known:
                continue
            self._known.add(entry.id)
            self._insert(entry)
            self._idle.clear()
            self._start(room)

        async def settled() -> None:
            for event in events:
                await event.wait()

        return settled

    def _insert(self, entry: OutboxEntry) -> None:
        """Queue ``entry`` in id order, never in front of the entry in flight."""
        queue = self._queues.setdefault(entry.reply.room, [])
        first = 1 if entry.reply.room in self._running else 0
        queue.insert(bisect.bisect(queue, entry.id, lo=first, key=lambda e: e.id), entry)

    def _start(self, room: RoomKey) -> None:
        if self._workers is None or not self._loaded or room in self._running:
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
                # What runs record meanwhile waits in its room's queue, so the
                # older entries this read finds still go first.
                self.submit(e for e in await self._undelivered() if self.owns(e.reply.room))
                self._loaded = True
                for room in list(self._queues):
                    self._start(room)
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
            except Exception:  # not StoreError alone: the service must not end here
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
        backoff = Backoff(self.retry_base_s, self.retry_cap_s)
        try:
            while queue:
                entry = queue[0]
                if not self.owns(room):
                    # Another replica owns the conversation now: it delivers them.
                    for left in queue:
                        self._known.discard(left.id)
                        self._settled.pop(left.id, asyncio.Event()).set()
                    queue.clear()
                    break
                try:
                    await self._deliver(entry)
                except Exception:
                    # A bug must not end the worker (and with it the service):
                    # the entry stays at the head and is tried again.
                    log.exception("delivering outbox entry %d failed inside chatbridge", entry.id)
                    await self.sleep(backoff.next_delay())
                    continue
                queue.pop(0)
                self._known.discard(entry.id)
                self._remember_settled(entry.id)
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
            stages.stamp(f"sent_{entry.reply.kind.value}")
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
                if entry.reply.file is not None:
                    await self._file_refused(entry, exc)
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
            except Exception:
                # Bookkeeping only; not StoreError alone: nothing here may end the worker.
                log.warning("could not record a delivery attempt", exc_info=True)
            await self.sleep(delay)

    async def _file_refused(self, entry: OutboxEntry, exc: Undeliverable) -> None:
        """Tell the room a file claude sent could not be posted (claude was told it was
        queued); once, under a key derived from the entry's."""
        name = Path(entry.reply.file or "").name
        notice = replace(
            entry.reply,
            text=f"Could not post the file `{name}`: {exc}",
            kind=ReplyKind.NOTICE,
            file=None,
        )
        try:
            self.submit(await self.store.enqueue_once(notice, f"{entry.key}-refused", self.clock()))
        except Exception:  # not StoreError alone: nothing here may end the worker
            log.warning("could not record that a file was refused", exc_info=True)

    async def send_unrecorded(self, reply: Reply, key: str, tries: int = UNRECORDED_TRIES) -> bool:
        """Send ``reply`` now, outside the outbox, when the store cannot record it.

        The last resort: rate limits are waited out and other failures backed
        off, ``tries`` times in all, with one idempotency key. True if it went out.
        """
        room = reply.room
        transport = self.transports.get(room.transport)
        if transport is None:
            log.error("cannot send to %s: transport %s is not configured", room, room.transport)
            return False
        backoff = Backoff(self.retry_base_s, self.retry_cap_s)
        parts_done = 0

        async def part_sent(index: int, message_id: ExternalMessageId) -> None:
            nonlocal parts_done
            parts_done = max(parts_done, index + 1)

        for attempt in range(tries):
            try:
                async with asyncio.timeout(self.send_timeout_s):
                    await transport.outbound.send(reply, Delivery(key, parts_done, part_sent))
            except Undeliverable as exc:
                log.error("gave up sending a %s to %s: %s", reply.kind.value, room, exc)
                return False
            except RateLimited as exc:
                delay = max(0.0, exc.retry_after_s)
                self.on_rate_limited(room.transport, delay)
            except Exception:
                delay = backoff.next_delay()
                log.warning("could not send to %s", room, exc_info=True)
            else:
                return True
            if attempt + 1 < tries:
                await self.sleep(delay)
        log.error("gave up sending a %s to %s after %d tries", reply.kind.value, room, tries)
        return False

    async def _send(self, entry: OutboxEntry, delivery: Delivery) -> None:
        room = entry.reply.room
        outbound = self.transports[room.transport].outbound  # submit() keeps the others out
        stages.stamp(f"sending_{entry.reply.kind.value}")
        # A hung server must not hold the room forever; the retry skips the
        # parts done, so giving up an attempt never posts a part twice.
        async with asyncio.timeout(self.send_timeout_s):
            if entry.reply.file is None:
                await outbound.send(entry.reply, delivery)
                return
            # A file post is one part: done once recorded as such.
            if delivery.parts_done >= 1:
                return
            if not await asyncio.to_thread(Path(entry.reply.file).is_file):
                raise Undeliverable(room.transport, "the copy of the file to post is gone")
            message_id = await outbound.send_file(entry.reply, delivery.key)
            await delivery.part_sent(0, message_id or ExternalMessageId(""))

    async def _finish(self, entry: OutboxEntry, state: DeliveryState) -> None:
        await self._record_finish(entry, state)
        if entry.reply.file is not None:
            # The bridge's copy (bridge.runs.file_posts) is the entry's alone: gone with it.
            await asyncio.to_thread(discard_copy, Path(entry.reply.file), entry.key)

    async def _record_finish(self, entry: OutboxEntry, state: DeliveryState) -> None:
        backoff = Backoff(self.retry_base_s, self.retry_cap_s)
        for attempt in range(FINISH_ATTEMPTS):
            try:
                await self.store.delivery_finished(entry.id, state, self.clock())
            except Exception:
                if attempt + 1 == FINISH_ATTEMPTS:
                    # The transport's idempotency key keeps a resend after the
                    # restart from posting it twice where the server supports it.
                    log.exception("could not record that outbox entry %d ended", entry.id)
                    return
                log.warning("could not record the end of a delivery; trying again")
            else:
                return
            await self.sleep(backoff.next_delay())

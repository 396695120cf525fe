"""This replica's part in a cluster of replicas on one PostgreSQL.

It keeps the replica registered, renews its leases, takes the conversations it is to serve,
gives up those it lost, and carries notifications between replicas; what a lease means for
the rest of the service is :mod:`bridge.cluster.role`'s, through callbacks given to the
constructor (:mod:`bridge.assembly`). Safety rests on the fence in the database
(:func:`bridge.store.cluster.check_fence`), not on this module's monotonic deadline, which
only makes a paused replica stop its runs promptly (docs/replicas.md, "Replicas and leases").
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from bridge.config import ClusterSettings
from bridge.core.model import RoomId, RoomKey, TransportName
from bridge.metrics import Metrics
from bridge.store.base import Fence, StoreError
from bridge.store.cluster import Lease, Leases, Replica, ReplicaReplaced, leader_key
from bridge.store.keys import room_key, stored_id

log = logging.getLogger(__name__)

NOTICE_WAIT_S = 5.0
NEIGHBOUR_HEARD_S = 600.0
"""A replica of this host silent for longer (or ten lease lifetimes) is no neighbour:
one paused past its lease is silent for about a lease's lifetime when looked for."""
IDLE_RELEASE_MIN_S = 60.0
"""A conversation idle this long (or four lease lifetimes, if longer) is let go."""
"""How long a notification may take to send before the poll is left to find the work."""


@dataclass(frozen=True, slots=True)
class Notice:
    """One replica's word to another (or to all, ``to`` empty), carried by NOTIFY."""

    kind: str
    """``message`` (a stored message for its conversation's owner), ``action`` (an
    approval button or reaction), or ``work`` (a conversation is free to take)."""
    to: str
    room: RoomKey
    body: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> str:
        return json.dumps(
            {
                "kind": self.kind,
                "to": self.to,
                "t": self.room.transport,
                "r": stored_id(self.room),
                "body": self.body,
            }
        )

    @staticmethod
    def decode(payload: str) -> Notice | None:
        try:
            data = json.loads(payload)
            return Notice(data["kind"], data["to"], room_key(data["t"], data["r"]), data["body"])
        except (ValueError, KeyError, TypeError):
            return None


_ANY = RoomKey(TransportName("*"), RoomId(""))
"""The room of a notice about no one conversation."""


def default_replica_id() -> str:
    return socket.gethostname()[:64] or "chatbridge"


@dataclass(slots=True)
class Cluster:
    """Registration, leases and notifications of this replica."""

    settings: ClusterSettings
    leases: Leases
    metrics: Metrics
    capacity: int
    """This replica's ``[runner] max_concurrent_runs``."""
    active_runs: Callable[[], int]
    """Runs holding a run slot here: a run that lent its slot while it waits for a
    person does not count, as in the dispatcher (docs/live-runs.md)."""
    state_dir: str
    """This replica's ``[runner] state_dir`` (absolute): recorded for the others."""
    serves: Callable[[str], bool]
    """Whether this replica may own conversations of a transport (Matrix: the leader only)."""
    take_over: Callable[[RoomKey], Awaitable[None]] | None = None
    """Recovers a conversation this replica just took (before anything else of it runs)."""
    give_up: Callable[[RoomKey], None] | None = None
    """Lets go of a conversation this replica lost."""
    released: Callable[[RoomKey], Awaitable[None]] | None = None
    """Lets go of what this replica kept for an idle conversation it released."""
    on_notice: Callable[[Notice], Awaitable[None]] | None = None
    idle: Callable[[RoomKey], bool] = lambda room: False
    """Whether a conversation has nothing running, waiting or being delivered here."""
    recheck: Callable[[], Awaitable[None]] | None = None
    """The poll's fallback for lost notifications, in conversations this replica owns."""
    replica_id: str = ""
    instance: str = field(default_factory=lambda: str(uuid.uuid4()))
    clock: Callable[[], float] = time.monotonic
    _owned: dict[RoomKey, Lease] = field(default_factory=dict)
    _valid_until: float = 0.0
    """Monotonic time until which the leases count as held (see the module's doc)."""
    _recovering: set[RoomKey] = field(default_factory=set)
    """Taken, and being recovered: not held yet for anything that would run."""
    _locks: dict[RoomKey, asyncio.Lock] = field(default_factory=dict)
    """One taking at a time per conversation."""
    _pending_notices: list[Notice] = field(default_factory=list)
    idle_release_min_s: float = IDLE_RELEASE_MIN_S
    _idle_since: dict[RoomKey, float] = field(default_factory=dict)
    """Owned conversations found idle by the poll, since when (monotonic)."""
    _leading: dict[str, Lease] = field(default_factory=dict)
    """Transports this replica leads (connects), by name: Matrix's sync."""
    lost_lead: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a leader lease is lost: the transport it gated must stop at once."""
    draining: bool = False
    """Shutting down: takes nothing new, and lets idle conversations go."""
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _left: bool = False
    """Left the registry (a graceful stop): no renewal any more, and none is missed."""

    def __post_init__(self) -> None:
        if not self.replica_id:
            self.replica_id = self.settings.replica_id or default_replica_id()

    # -- start and stop --

    async def register(self) -> None:
        """Join the cluster; raises ReplicaIdInUse if a live replica has this id."""
        previous = await self.leases.previous(self.replica_id)
        alive = previous is not None and pid_alive(previous.pid)
        await self.leases.register(
            Replica(
                self.replica_id,
                self.instance,
                socket.gethostname(),
                os.getpid(),
                0.0,
                0.0,
                0,
                self.capacity,
                False,
                self.state_dir,
            ),
            alive=alive,
        )
        self._valid_until = self.clock() + self.settings.lease_ttl_s
        log.info("joined the cluster as replica %s", self.replica_id)

    async def keep_own(self) -> list[RoomKey]:
        """The conversations this replica held before a restart, still unexpired: kept."""
        kept = []
        for lease, live in await self.leases.leases():
            if lease.owner == self.replica_id and live and lease.room.room_id:
                again = await self.leases.acquire(lease.room, self.replica_id)
                if again is not None:
                    self._owned[lease.room] = again
                    kept.append(lease.room)
        return kept

    async def leave(self) -> None:
        """Let every conversation go at once (a graceful stop), and unregister."""
        self._left = True
        self._owned.clear()
        try:
            await self.leases.release_all(self.replica_id, self.instance)
            await self._notify(Notice("work", "", _ANY))
        except StoreError:
            log.warning("could not leave the cluster; the leases expire on their own")

    # -- ownership --

    def holds(self, room: RoomKey) -> bool:
        """Whether this replica owns ``room`` now (by its own clock; the fence decides)."""
        if room not in self._owned or room in self._recovering:
            return False
        if self.clock() >= self._valid_until:
            self._lose_all("no lease renewal for the lease's lifetime")
            return False
        return True

    def has(self, room: RoomKey) -> bool:
        """Whether ``room``'s lease is this replica's, also while it is being recovered."""
        return (room in self._owned and self.holds(room)) or room in self._recovering

    def fence(self, room: RoomKey) -> Fence:
        """The claim a run's start in ``room`` is recorded under (fails if not held)."""
        lease = self._owned.get(room)
        token = -1 if lease is None else lease.token
        return Fence(self.replica_id, token, self.settings.max_concurrent_runs)

    async def neighbours(self) -> dict[int, float]:
        """The other replicas registered on this host and heard from lately (a row
        left by a crash long ago names a pid that is anyone's since): pid -> when
        it registered (wall clock)."""
        here = socket.gethostname()
        since = time.time() - max(NEIGHBOUR_HEARD_S, 10 * self.settings.lease_ttl_s)
        return {
            r.pid: r.started_at
            for r in await self.leases.replicas()
            if r.host == here
            and r.id != self.replica_id
            and r.pid != os.getpid()
            and r.heartbeat_at >= since
        }

    def owned(self) -> list[RoomKey]:
        return list(self._owned)

    async def place(self, room: RoomKey, *, need_slot: bool = True) -> str | None:
        """None if this replica owns ``room`` now (taking it if nobody does and it can);
        otherwise the owner's id, or ``""`` if nobody owns it and this replica cannot take it.
        """
        if self.holds(room):
            return None
        if not self.serves(room.transport) or self.draining:
            return await self._owner(room)
        if need_slot and self.active_runs() >= self.capacity:
            return await self._owner(room)
        if await self._take(room):
            return None
        return await self._owner(room)

    async def _owner(self, room: RoomKey) -> str:
        found = await self.leases.lease(room)
        if found is None or not found[1]:
            return ""
        return found[0].owner

    async def _take(self, room: RoomKey) -> bool:
        """Acquire ``room`` and recover it; concurrent callers wait for the one taking it.

        Until its recovery is done the room does not count as held: nothing
        of it may run before the old owner's run is known stopped.
        """
        lock = self._locks.setdefault(room, asyncio.Lock())
        async with lock:
            if self.holds(room):
                return True
            lease = await self.leases.acquire(room, self.replica_id)
            if lease is None:
                return False
            self._owned[room] = lease
            self._recovering.add(room)
            try:
                if self.take_over is not None:
                    await self.take_over(room)
            except BaseException:
                # Half taken: let it go, so that it is taken (and recovered) again.
                self._recovering.discard(room)
                self._lose(room, "its recovery failed")
                raise
            self._recovering.discard(room)
            self.metrics.lease_moves.labels("new" if lease.token == 1 else "moved").inc()
            log.info("took %s (token %d)", room, lease.token)
            return True

    def _lose(self, room: RoomKey, why: str) -> None:
        if self._owned.pop(room, None) is None:
            return
        log.warning("lost %s: %s", room, why)
        self.metrics.leases_lost.inc()
        if self.give_up is not None:
            self.give_up(room)

    def _lose_all(self, why: str) -> None:
        for room in list(self._owned):
            self._lose(room, why)
        for transport in list(self._leading):
            self._lose_lead(transport, why)

    # -- leading a transport --

    async def try_lead(self, transport: str) -> bool:
        """Take ``transport``'s leader lease if nobody holds it; whether this replica leads."""
        if self.leads(transport):
            return True
        if self.draining:
            return False
        lease = await self.leases.acquire(leader_key(transport), self.replica_id)
        if lease is None:
            return False
        self._leading[transport] = lease
        self.lost_lead.clear()
        log.info("leading %s (token %d)", transport, lease.token)
        return True

    def leads(self, transport: str) -> bool:
        if transport not in self._leading:
            return False
        if self.clock() >= self._valid_until:
            self._lose_all("no lease renewal for the lease's lifetime")
            return False
        return True

    def _lose_lead(self, transport: str, why: str) -> None:
        if self._leading.pop(transport, None) is None:
            return
        log.warning("no longer leading %s: %s", transport, why)
        # Its conversations need the transport: they go to the new leader.
        for room in list(self._owned):
            if room.transport == transport:
                self._lose(room, f"no longer leading {transport}")
        self.lost_lead.set()

    async def release_idle(self, idle: Iterable[RoomKey], *, tell: bool = True) -> None:
        """Let conversations with nothing running go at once (scale-in: ``tell`` the
        others, which take those with work)."""
        rooms = [room for room in idle if self._owned.pop(room, None) is not None]
        if not rooms:
            return
        if self.released is not None:
            for room in rooms:
                await self.released(room)
        await self.leases.release(rooms, self.replica_id)
        if tell:
            for room in rooms:
                await self._notify(Notice("work", "", room))
        log.info("let %d idle conversation(s) go", len(rooms))

    def wake(self) -> None:
        """Look for work now (a run ended here: a slot is free for a conversation
        nobody owns), not at the next poll."""
        self._wake.set()

    # -- notifications --

    async def tell(self, to: str, kind: str, room: RoomKey, body: dict[str, Any]) -> None:
        """Send ``body`` to replica ``to`` (``""``: to every replica)."""
        await self._notify(Notice(kind, to, room, body))

    async def _notify(self, notice: Notice) -> None:
        try:
            async with asyncio.timeout(NOTICE_WAIT_S):
                await self.leases.notify(notice.encode())
        except (StoreError, TimeoutError):
            # The poll finds the work (a pending message) within poll_s.
            log.warning("could not notify %s; the poll will find it", notice.to or "the cluster")

    def _heard(self, payload: str) -> None:
        notice = Notice.decode(payload)
        if notice is None:
            log.warning("ignored a malformed cluster notification")
            return
        if notice.to not in ("", self.replica_id):
            return
        if notice.kind == "work":
            self._wake.set()
            return
        if self.on_notice is not None:
            self._pending_notices.append(notice)
            self._wake.set()

    # -- the loops --

    async def serve(self) -> None:
        """Heartbeat, listen and poll until cancelled; ReplicaReplaced ends it."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._heartbeat(), name="cluster heartbeat")
            tg.create_task(self.leases.listen(self._heard), name="cluster listener")
            tg.create_task(self._work(), name="cluster poll")

    async def _heartbeat(self) -> None:
        every = self.settings.renew_every_s
        while not self._left:
            sent = self.clock()
            # What this renewal is of: a lease taken while it is under way is not
            # in its answer, and is not lost for that (its acquisition renewed it).
            sent_owned = dict(self._owned)
            sent_leading = dict(self._leading)
            held_now = [(room, lease.token) for room, lease in sent_owned.items()]
            held_now += [(leader_key(t), lease.token) for t, lease in sent_leading.items()]
            try:
                async with asyncio.timeout(every):
                    renewal = await self.leases.heartbeat(
                        self.replica_id,
                        self.instance,
                        runs=self.active_runs(),
                        capacity=self.capacity,
                        draining=self.draining,
                        held=held_now,
                    )
            except ReplicaReplaced:
                if self._left:
                    return  # our own row, deleted as we left: not another instance's
                raise
            except (StoreError, TimeoutError) as exc:
                log.warning("lease renewal failed: %s", exc)
                if self.clock() >= self._valid_until:
                    self._lose_all("no lease renewal for the lease's lifetime")
            else:
                if self.clock() >= self._valid_until:
                    # Paused past the deadline (SIGSTOP, a frozen VM): what this
                    # renewal found may be newer than what was given up; start over.
                    self._lose_all("no lease renewal for the lease's lifetime")
                self._valid_until = sent + self.settings.lease_ttl_s
                held = {lease.room: lease for lease in renewal.leases}
                for transport, lease in list(self._leading.items()):
                    if leader_key(transport) in held:
                        self._leading[transport] = held[leader_key(transport)]
                    elif sent_leading.get(transport) is lease:
                        self._lose_lead(transport, "its leader lease was taken or ran out")
                for room, lease in list(self._owned.items()):
                    if room in held:
                        self._owned[room] = held[room]
                    elif sent_owned.get(room) is lease:
                        self._lose(room, "its lease was taken or ran out")
            self.metrics.owned_conversations.set(len(self._owned))
            await asyncio.sleep(every)

    async def _work(self) -> None:
        """Forwarded notices at once; every ``poll_s`` the unowned work of the cluster."""
        while True:
            try:
                async with asyncio.timeout(self.settings.poll_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            notices, self._pending_notices = self._pending_notices, []
            for notice in notices:
                if self.on_notice is not None:
                    try:
                        await self.on_notice(notice)
                    except StoreError:
                        log.warning("a forwarded %s failed; the poll retries it", notice.kind)
            try:
                await self.poll()
                if self.recheck is not None:
                    await self.recheck()
                await self._let_idle_go()
            except StoreError as exc:
                log.warning("polling the cluster's work failed: %s", exc)

    async def _let_idle_go(self) -> None:
        """Conversations idle here for a while go back to the cluster: their leases
        would otherwise pile up (every thread is one), and placement would never
        move them to a replica with room."""
        now = self.clock()
        idle = []
        for room in list(self._owned):
            if room in self._recovering or not self.idle(room):
                self._idle_since.pop(room, None)
            elif now - self._idle_since.setdefault(room, now) >= self.idle_release_s:
                idle.append(room)
        for room in idle:
            del self._idle_since[room]
            lock = self._locks.get(room)
            if lock is not None and not lock.locked():
                del self._locks[room]
        if idle:
            await self.release_idle(idle, tell=False)

    @property
    def idle_release_s(self) -> float:
        return max(self.idle_release_min_s, 4 * self.settings.lease_ttl_s)

    async def poll(self) -> None:
        """Take conversations with work and no live owner, while this replica has slots."""
        if self.draining:
            return
        free = self.capacity - self.active_runs()
        if free <= 0:
            return
        transports = [t for t in ("slack", "matrix") if self.serves(t)]
        work = await self.leases.unowned_work(transports, free)
        oldest = min((since for _, since in work), default=None)
        self.metrics.unowned_lag.set(0.0 if oldest is None else max(0.0, time.time() - oldest))
        # Side by side: one takeover that must stop a dead replica's run (a sweep
        # of this host's processes) does not hold up the others.
        results = await asyncio.gather(
            *(self.place(room) for room, _ in work), return_exceptions=True
        )
        for (room, _), result in zip(work, results, strict=True):
            if isinstance(result, StoreError):
                log.warning("could not take %s: %s", room, result)
            elif isinstance(result, BaseException):
                raise result


def pid_alive(pid: int) -> bool:
    """Whether another process ``pid`` runs on this host (this process: not "another")."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["Cluster", "Notice", "default_replica_id", "pid_alive"]

"""Review of the replicas (issue 14): defects found by trying to break them, each a
test that fails on the code it was written against (docs/replicas.md)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from bridge.core.model import ReplyKind, RoomKey
from bridge.store.base import StoreError
from bridge.store.cluster import Renewal
from tests.replicas.conftest import (
    ROOM,
    SlackRoom,
    held_room_stops,
    replica,
    replica_settings,
    until,
)

# Everything below is answered within a lease's lifetime and a few polls
# (lease_ttl_s = 4, poll_s = 0.2) when it works; the guard only bounds a failure.
ANSWERED_S = 15.0


def results(chat: Any) -> list[str]:
    return list(chat.texts(ReplyKind.RESULT))


async def test_a_conversation_taken_while_a_renewal_is_under_way_is_not_lost(
    tmp_path: Path, cluster_db: str
) -> None:
    """The heartbeat's answer lists the leases renewed when it ran; a conversation
    acquired after that statement but before the answer is handled is not in it,
    and the heartbeat lets it go ("taken or ran out") although the database says
    this replica holds it. The message that made the replica take it is then
    fenced at its start, nobody else may take the conversation (the heartbeat
    keeps renewing the row), and the message never runs."""
    async with replica(replica_settings(tmp_path, "a", cluster_db)) as a:
        cluster = a.service.parts.cluster
        assert cluster is not None
        renew, acquire = cluster.leases.heartbeat, cluster.leases.acquire
        renewed, acquired = asyncio.Event(), asyncio.Event()
        armed = True

        async def heartbeat(*args: Any, **kwargs: Any) -> Renewal:
            nonlocal armed
            renewal = await renew(*args, **kwargs)
            if armed:
                armed = False
                renewed.set()
                # Committed; its answer is on its way back while the conversation is taken.
                await acquired.wait()
            return renewal

        async def taking(*args: Any, **kwargs: Any) -> Any:
            lease = await acquire(*args, **kwargs)
            acquired.set()
            return lease

        cluster.leases.heartbeat = heartbeat  # type: ignore[method-assign]
        cluster.leases.acquire = taking  # type: ignore[method-assign]
        async with asyncio.timeout(ANSWERED_S):
            await renewed.wait()
        await a.chat.say("hello")
        await until(lambda: results(a.chat) == ["hello"], ANSWERED_S)


async def test_a_conversation_whose_recovery_failed_is_taken_again(
    tmp_path: Path, cluster_db: str
) -> None:
    """A takeover whose recovery fails (the database failed a read) lets the
    conversation go "so that it is taken (and recovered) again": but only in
    this replica's memory. Its lease row stays this replica's and every
    heartbeat renews it (the renewal is of every unexpired row it owns), so no
    poll ever finds the conversation unowned: its pending message never runs."""
    async with replica(replica_settings(tmp_path, "a", cluster_db)) as a:
        cluster = a.service.parts.cluster
        assert cluster is not None
        recover = cluster.take_over
        assert recover is not None
        failures = 1

        async def failing(room: RoomKey) -> None:
            nonlocal failures
            if failures:
                failures -= 1
                raise StoreError("the database failed a read")
            assert recover is not None
            await recover(room)

        cluster.take_over = failing
        with pytest.raises(StoreError):
            await a.chat.say("hello")  # recorded; the transport is told it failed
        await until(lambda: results(a.chat) == ["hello"], ANSWERED_S)


async def test_a_command_forwarded_to_a_dead_owner_is_carried_out_by_the_next(
    tmp_path: Path, cluster_db: str
) -> None:
    """b accepts `!status` for a conversation whose owner has just died (its lease
    still runs) and tells that owner, who never hears it. b's poll takes the
    conversation over once the lease runs out, and the takeover's recovery settles
    every pending command unrun, as a restart does ("accepted just before a
    crash"): but this one was accepted by a live replica and never reached its
    owner. It is settled unanswered: the command is lost."""
    async with replica(replica_settings(tmp_path, "b", cluster_db)) as b:
        cluster = b.service.parts.cluster
        assert cluster is not None
        # Replica z owned the conversation and died: its lease runs for lease_ttl_s.
        assert await cluster.leases.acquire(ROOM, "z") is not None
        await b.chat.say("!status")
        await until(lambda: cluster.holds(ROOM), ANSWERED_S)
        await until(lambda: len(b.chat.texts(ReplyKind.NOTICE)) >= 1, ANSWERED_S)


async def test_a_message_after_a_top_level_stop_in_a_thread_room_is_not_dropped(
    tmp_path: Path, cluster_db: str
) -> None:
    """A top-level `!stop` stops this replica's threads and tells every replica
    (NOTIFY to all). The replica that asked hears its own notice too, and stops
    its threads a second time when the notice comes (at a time nobody controls:
    it waits behind the poll's work): a message sent after the `!stop` and
    still waiting in its queue then is dropped, unanswered."""
    config = {"defaults": {"conversation": "thread"}}
    thread = ROOM.in_thread("t1")
    async with (
        replica(replica_settings(tmp_path, "a", cluster_db, config)) as a,
        replica(replica_settings(tmp_path, "b", cluster_db, config)),
    ):
        # The notice comes back after the next message was queued.
        queued = held_room_stops(a)
        await a.chat.say("!stop")
        await a.chat.say("after the stop", thread="t1")
        assert a.service.parts.dispatcher.status(thread).waiting == 1
        queued.set()
        await until(lambda: results(a.chat) == ["after the stop"], ANSWERED_S)


async def test_a_replica_restarted_within_its_leases_reattaches_its_detached_run(
    tmp_path: Path, cluster_db: str
) -> None:
    """docs/replicas.md: with `on_shutdown = "detach"` a replica restarted with its
    id before its leases ran out "keeps them and reattaches its detached runs".
    It keeps the leases, but nothing recovers the kept conversations: their runs
    are not reattached (the start-up's sweep stops them as strays, no record
    naming them as adopted), nobody reports them, and the run stays marked
    running in the database."""
    gate = tmp_path / "gate"
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_WAIT_FOR": str(gate)}
    config = {"runner": {"on_shutdown": "detach"}, "cluster": {"lease_ttl_s": 60}}
    settings = replica_settings(tmp_path, "a", cluster_db, config, env=env)
    async with replica(settings) as a:
        await a.chat.say("a long one")
        async with asyncio.timeout(ANSWERED_S):
            while not await a.service.store.live_runs():  # registered: detachable
                await asyncio.sleep(0.01)
    again = SlackRoom(ROOM, "U1", id_prefix="a-again")
    async with replica(settings, again) as a:
        assert a.service.parts.cluster is not None
        assert a.service.parts.cluster.holds(ROOM)  # kept
        gate.touch()
        await until(lambda: results(again) == ["a long one"], ANSWERED_S)


async def test_a_top_level_status_lists_only_other_replicas_threads_with_work(
    tmp_path: Path, cluster_db: str
) -> None:
    """A thread conversation keeps its lease for as long as its replica lives (it is
    renewed whether the thread has work or not), and every top-level message
    opens a thread conversation of its own. The top-level `!status` lists every
    live lease of other replicas as a thread "on replica b": threads that ended
    long ago, and the threads opened by top-level commands, while this replica's
    own lines list only threads with work."""
    config = {"defaults": {"conversation": "thread"}}
    async with (
        replica(replica_settings(tmp_path, "a", cluster_db, config)) as a,
        replica(replica_settings(tmp_path, "b", cluster_db, config)) as b,
    ):
        await b.chat.say("answered long ago", thread="t2")
        await b.chat.wait_until(lambda: results(b.chat) == ["answered long ago"])
        await b.service.parts.dispatcher.wait_idle()
        await a.chat.say("!status")
        await a.chat.wait_until(lambda: len(a.chat.texts(ReplyKind.NOTICE)) >= 1)
        assert a.chat.texts(ReplyKind.NOTICE)[-1] == "No thread of this room has work."


async def test_a_renewal_after_leaving_the_registry_does_not_crash_the_stop(
    tmp_path: Path, cluster_db: str
) -> None:
    """A graceful stop leaves the registry (its row deleted) while the heartbeat
    still runs until the service's background tasks are cancelled. A renewal in
    between finds no row of this instance, takes it for ReplicaReplaced, and the
    replica's clean stop ends in that error."""
    settings = replica_settings(tmp_path, "a", cluster_db)
    async with replica(settings) as a:
        cluster = a.service.parts.cluster
        assert cluster is not None
        leave, renew = cluster.leases.release_all, cluster.leases.heartbeat
        renewed = asyncio.Event()

        async def heartbeat(*args: Any, **kwargs: Any) -> Renewal:
            try:
                return await renew(*args, **kwargs)
            finally:
                renewed.set()

        async def release_all(*args: Any, **kwargs: Any) -> None:
            await leave(*args, **kwargs)
            renewed.clear()
            # A renewal comes before the stop cancels the heartbeat (if it still
            # renews: a few renewal periods bound the wait).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(3 * settings.cluster.renew_every_s):
                    await renewed.wait()

        cluster.leases.heartbeat = heartbeat  # type: ignore[method-assign]
        cluster.leases.release_all = release_all  # type: ignore[method-assign]
        a.service.request_stop()
        await asyncio.wait({a.task})
        assert a.task.exception() is None

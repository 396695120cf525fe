"""Socket Mode contract tests: disconnects, dropped sockets and redeliveries.

local-slack neither sends ``disconnect`` envelopes nor redelivers, so these
run against :mod:`tests.transports.slack.fake_slack`, which speaks Slack's documented frames.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from sqlalchemy import event

from bridge.core.model import ExternalMessageId, InboundMessage, RoomId, RoomKey, TransportName
from bridge.core.transport import Accepted, InboundEvent, RoomBinding, SeenMarks
from bridge.store.memory import MemoryStore
from bridge.store.sql import SqlStore
from tests.transports.slack.fake_slack import (
    BOT_USER,
    CHANNEL,
    HELLO,
    FakeSlack,
    disconnect,
    fake_slack,
    message_envelope,
)
from tests.transports.slack.harness import RecordingSink
from transports.backoff import Backoff
from transports.slack.settings import SlackSettings
from transports.slack.transport import SlackTransport


@dataclass
class Session:
    fake: FakeSlack
    transport: SlackTransport
    sink: RecordingSink
    ready: asyncio.Event

    async def next_socket(self) -> web.WebSocketResponse:
        """Wait for the transport's next connection and greet it."""
        async with asyncio.timeout(10):
            ws = await self.fake.sockets.get()
        await ws.send_json(HELLO)
        return ws

    async def ack(self) -> str:
        async with asyncio.timeout(10):
            return await self.fake.acks.get()


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def session(
    clock: ManualClock | None = None,
    backoff: Backoff | None = None,
    marks: SeenMarks | None = None,
) -> AsyncIterator[Session]:
    async with fake_slack() as fake:
        settings = SlackSettings(
            mode="socket", bot_token="xoxb-x", app_token="xapp-x", api_url=fake.api_url
        )
        transport = SlackTransport(
            settings,
            [RoomBinding(RoomId(CHANNEL))],
            marks=marks,
            backoff=backoff or Backoff(base=0.01, cap=0.05),
            clock=clock or ManualClock(),
            wall=lambda: 1000.0,
        )
        sink = RecordingSink()
        ready = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(transport.run(sink, ready))
            try:
                yield Session(fake, transport, sink, ready)
            finally:
                task.cancel()


async def test_ack_follows_the_hand_over_and_ready_follows_hello() -> None:
    async with session() as s:
        ws = await s.next_socket()
        async with asyncio.timeout(10):
            await s.ready.wait()
        assert s.transport.connected
        await ws.send_json(message_envelope("E1", "1.000001", "hello"))
        assert await s.ack() == "E1"
        assert s.sink.texts == ["hello"]


async def test_disconnect_envelope_reconnects_without_loss_or_doubling() -> None:
    async with session() as s:
        first = await s.next_socket()
        await first.send_json(message_envelope("E1", "1.000001", "before"))
        assert await s.ack() == "E1"
        await first.send_json(disconnect("refresh_requested"))
        second = await s.next_socket()
        # Slack redelivers what it has no ack for; here E1 again, as if the ack was lost.
        await second.send_json(message_envelope("E1", "1.000001", "before", retry_attempt=1))
        await second.send_json(message_envelope("E2", "1.000002", "after"))
        assert sorted([await s.ack(), await s.ack()]) == ["E1", "E2"]  # settled concurrently
        assert s.sink.texts == ["before", "after"]
        assert s.fake.calls_to("apps.connections.open") == 2
        assert s.transport.connections == 2
        assert s.transport.reconnects == 1


def human(ts: str, text: str) -> dict[str, object]:
    return {"type": "message", "user": "U0ALICE", "ts": ts, "text": text}


async def test_every_connection_catches_up_what_was_sent_while_none_was_open() -> None:
    """Slack drops events sent while no connection is open: the transport reads them
    from the channel's history after the newest it saw, on the first connection and on
    every reconnect, waiting out a 429 as Slack's Retry-After asks (issue 25)."""
    store = MemoryStore()
    channel = RoomKey(TransportName("slack"), RoomId(CHANNEL))
    await store.mark_seen({channel: ExternalMessageId("100.000001")}, 1000.0)
    async with session(marks=store) as s:
        s.fake.history += [human("99.000001", "long seen"), human("100.000002", "while down")]
        s.fake.rate_limited["conversations.history"] = [0]
        first = await s.next_socket()
        await s.sink.wait_for(1)
        await first.send_json(message_envelope("E1", "100.000003", "live"))
        assert await s.ack() == "E1"
        s.fake.history += [human("100.000003", "live"), human("100.000004", "in the gap")]
        await first.send_json(disconnect("refresh_requested"))
        await s.next_socket()
        await s.sink.wait_for(3)  # the last from the second connection's catch-up
        async with asyncio.timeout(10):
            await s.transport.caught_up.wait()
        assert s.sink.texts == ["while down", "live", "in the gap"]
        assert s.transport.caught_up_events == 2
        assert s.fake.calls_to("conversations.history") == 3  # one answered 429


async def test_a_live_message_during_an_unfinished_catch_up_does_not_lose_what_it_missed() -> None:
    """A live message let through while the catch-up still waits (a 429) must not move
    the channel's mark past what the catch-up has yet to read: after a restart the
    message sent while down is still caught up."""
    store = MemoryStore()
    channel = RoomKey(TransportName("slack"), RoomId(CHANNEL))
    await store.mark_seen({channel: ExternalMessageId("100.000001")}, 1000.0)
    down = human("100.000002", "while down")
    async with session(marks=store) as s:
        s.fake.history.append(down)
        s.fake.rate_limited["conversations.history"] = [3600]  # the catch-up waits an hour
        ws = await s.next_socket()
        await ws.send_json(message_envelope("E1", "100.000003", "live"))
        assert await s.ack() == "E1"  # handed over once the live hold ran out
        assert s.sink.texts == ["live"]
    assert (await store.seen_marks(TransportName("slack")))[channel] < "100.000002"
    async with session(marks=store) as s:
        s.fake.history += [down, human("100.000003", "live")]
        await s.next_socket()
        await s.sink.wait_for(1)
        async with asyncio.timeout(10):
            await s.transport.caught_up.wait()
        # "live" again too: the store's idempotent accept drops it.
        assert s.sink.texts == ["while down", "live"]


async def test_a_catch_up_needing_more_calls_than_a_rate_limit_window_allows_finishes() -> None:
    """Some apps may call conversations.* once a minute: each answered call must count,
    not be read again from the channel's first page after every 429."""
    store = MemoryStore()
    channel = RoomKey(TransportName("slack"), RoomId(CHANNEL))
    await store.mark_seen({channel: ExternalMessageId("100.000001")}, 1000.0)
    async with session(marks=store) as s:
        parent = human("100.000002", "a question")
        parent.update(
            thread_ts="100.000002",
            reply_count=2,
            latest_reply="100.000004",
            reply_users=["U0ALICE"],
        )
        s.fake.history += [parent, human("100.000005", "a follow-up")]
        for ts in ("100.000003", "100.000004"):
            s.fake.history.append({**human(ts, f"reply {ts}"), "thread_ts": "100.000002"})
        s.fake.history.sort(key=lambda m: str(m["ts"]))
        s.fake.history_spacing_s = 0.3
        await s.next_socket()
        async with asyncio.timeout(10):
            await s.sink.wait_for(4)
            await s.transport.caught_up.wait()
        replies = ["reply 100.000003", "reply 100.000004"]
        assert s.sink.texts == ["a question", *replies, "a follow-up"]


async def test_unsettled_envelope_is_not_acked_and_is_taken_on_redelivery() -> None:
    async with session() as s:
        first = await s.next_socket()
        s.sink.fail_next = 1
        await first.send_json(message_envelope("E1", "1.000001", "store down"))
        await first.send_json(message_envelope("E2", "1.000002", "store back"))
        # E1 goes to the sink before E2 (see transports.slack.turns): E2's ack
        # means E1's hand-over has failed; E1 stays unacknowledged.
        assert await s.ack() == "E2"
        await first.close()  # the socket drops: reconnect with backoff
        second = await s.next_socket()
        await second.send_json(message_envelope("E1", "1.000001", "store down", retry_attempt=1))
        assert await s.ack() == "E1"
        assert s.sink.texts == ["store back", "store down"]


async def test_own_messages_and_other_events_are_acked_and_dropped() -> None:
    async with session() as s:
        ws = await s.next_socket()
        await ws.send_json(message_envelope("E1", "1.000001", "echo", user=BOT_USER))
        other = message_envelope("E2", "1.000002", "")
        other["payload"]["event"] = {"type": "reaction_added", "user": "U0ALICE", "reaction": "x"}
        await ws.send_json(other)
        edit = message_envelope("E3", "1.000003", "")
        edit["payload"]["event"].update(subtype="message_changed", message={"text": "edited"})
        await ws.send_json(edit)
        await ws.send_json(message_envelope("E4", "1.000004", "real"))
        assert sorted([await s.ack() for _ in range(4)]) == ["E1", "E2", "E3", "E4"]
        assert s.sink.texts == ["real"]


async def test_error_answers_back_off_and_recover() -> None:
    async with session() as s:
        s.fake.errors["apps.connections.open"] = ["internal_error", "internal_error"]
        s.fake.errors["auth.test"] = ["fatal_error"]
        ws = await s.next_socket()
        async with asyncio.timeout(10):
            await s.ready.wait()
        await ws.send_json(message_envelope("E1", "1.000001", "finally"))
        assert await s.ack() == "E1"
        assert s.fake.calls_to("apps.connections.open") == 3
        assert s.sink.texts == ["finally"]


async def test_socket_mode_disabled_is_an_error_retried_with_backoff() -> None:
    async with session() as s:
        first = await s.next_socket()
        await first.send_json(disconnect("link_disabled"))
        second = await s.next_socket()
        await second.send_json(message_envelope("E1", "1.000001", "still here"))
        assert await s.ack() == "E1"
        assert s.sink.texts == ["still here"]
        assert s.transport.connections == 2


async def test_only_a_connection_that_held_up_resets_the_backoff() -> None:
    clock = ManualClock()
    backoff = Backoff(base=0.001, cap=0.01)
    async with session(clock, backoff) as s:
        await (await s.next_socket()).close()  # drops at once
        second = await s.next_socket()
        assert backoff.failures == 1
        # Frames are handled in order: this ack means hello was seen at time 0.
        await second.send_json(message_envelope("E1", "1.000001", "sync"))
        assert await s.ack() == "E1"
        clock.now += 31  # this one holds up
        await second.close()
        third = await s.next_socket()
        assert backoff.failures == 1
        await third.close()
        await s.next_socket()
        assert backoff.failures == 2


class StoreSink:
    """The service's first step for a message: record it in a real SQLite store.

    Counts the messages handed over, those recorded, and the store's commits;
    an edit notes how many messages were recorded when it was handed over.
    """

    def __init__(self, store: SqlStore, expected: int) -> None:
        self.store = store
        self.messages = 0
        self.recorded = 0
        self.commits = 0
        self.all_handed = asyncio.Event()
        self.expected = expected
        self.edit_after: list[int] = []
        self.edit_saw: list[str] = []

        @event.listens_for(store.writes_on, "commit")
        def _commit(_conn: object) -> None:
            self.commits += 1

    async def __call__(self, inbound: InboundEvent) -> Accepted:
        if isinstance(inbound, InboundMessage):
            self.messages += 1
            if self.messages == self.expected:
                self.all_handed.set()
            await self.store.accept(inbound, 1.0)
            self.recorded += 1
        else:
            self.edit_after.append(self.recorded)
            self.edit_saw = [m.text for m in await self.store.pending_messages()]
        return Accepted.ACCEPTED


async def test_a_burst_is_recorded_in_one_commit_in_order_and_an_edit_waits_for_it(
    tmp_path: Path,
) -> None:
    """Envelopes do not wait for the ones before to be recorded: a burst that arrives while
    the store is busy goes in one transaction, in order; an edit after it waits for it all."""
    database = tmp_path / "store.db"
    store = await SqlStore.open(f"sqlite+aiosqlite:///{database}")
    texts = [f"m{i}" for i in range(12)]
    sink = StoreSink(store, expected=len(texts))
    busy = sqlite3.connect(database, isolation_level=None)  # another writer, as a process could be
    try:
        async with fake_slack() as fake:
            settings = SlackSettings(bot_token="b", app_token="a", api_url=fake.api_url)
            transport = SlackTransport(
                settings, [RoomBinding(RoomId(CHANNEL))], backoff=Backoff(base=0.01, cap=0.05)
            )
            async with asyncio.TaskGroup() as tg:
                task = tg.create_task(transport.run(sink, asyncio.Event()))
                async with asyncio.timeout(10):
                    ws = await fake.sockets.get()
                await ws.send_json(HELLO)
                busy.execute("BEGIN IMMEDIATE")
                for i, text in enumerate(texts):
                    await ws.send_json(message_envelope(f"E{i}", f"1.{i:06d}", text))
                edit = message_envelope("EDIT", "2.000000", "")
                edit["payload"]["event"].update(
                    subtype="message_changed",
                    message={"ts": "1.000000", "text": "m0 fixed", "user": "U0ALICE"},
                    previous_message={"ts": "1.000000", "text": "m0", "user": "U0ALICE"},
                )
                await ws.send_json(edit)
                # An event the bridge does not use: handled without waiting for the
                # envelopes before it, along the edit's path up to its wait. Its ack
                # means the edit has reached its wait (or, were it not to wait, the sink).
                other = message_envelope("OTHER", "3.000000", "")
                other["payload"]["event"] = {"type": "reaction_added", "user": "U0ALICE"}
                await ws.send_json(other)
                async with asyncio.timeout(10):
                    # Every message handed over while the first one's commit waits.
                    await sink.all_handed.wait()
                    assert await fake.acks.get() == "OTHER"
                assert sink.recorded == 0
                assert sink.edit_after == []  # the edit waits for them
                busy.execute("ROLLBACK")
                async with asyncio.timeout(10):
                    acks = [await fake.acks.get() for _ in range(len(texts) + 1)]
                task.cancel()
        recorded = [m.text for m in await store.pending_messages()]
    finally:
        busy.close()
        await store.close()
    assert sorted(acks) == sorted([f"E{i}" for i in range(len(texts))] + ["EDIT"])
    assert recorded == texts
    assert sink.edit_after == [len(texts)]  # the edit went after every message before it
    assert sink.edit_saw == texts
    assert sink.commits <= 3  # the first message alone, the others together (+ the edit's read)

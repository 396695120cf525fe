"""Socket Mode bursts against a real SQLite store: redeliveries, the in-flight cap,
a socket dropped mid-burst (from the R3 review; fake Slack, as in test_socket_mode)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from bridge.core.model import InboundMessage, RoomId
from bridge.core.transport import Accepted, InboundEvent, RoomBinding
from bridge.store.sql import SqlStore
from tests.transports.slack.fake_slack import (
    CHANNEL,
    HELLO,
    FakeSlack,
    fake_slack,
    message_envelope,
)
from transports.backoff import Backoff
from transports.slack import socket_mode
from transports.slack.settings import SlackSettings
from transports.slack.transport import SlackTransport


class Sink:
    """Records messages in the store; counts those inside it; may hold them at a gate."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.in_flight = 0
        self.most = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self._entered = asyncio.Condition()

    async def __call__(self, inbound: InboundEvent) -> Accepted:
        assert isinstance(inbound, InboundMessage)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        async with self._entered:
            self._entered.notify_all()
        try:
            await self.gate.wait()
            got = await self.store.accept(inbound, 1.0)
            return Accepted.ACCEPTED if got else Accepted.DUPLICATE
        finally:
            self.in_flight -= 1

    async def until_in_flight(self, count: int) -> None:
        async with self._entered:
            await self._entered.wait_for(lambda: self.in_flight >= count)


@dataclass
class Burst:
    fake: FakeSlack
    sink: Sink
    database: Path

    async def socket(self) -> web.WebSocketResponse:
        ws = await self.fake.sockets.get()
        await ws.send_json(HELLO)
        return ws

    async def acks(self, count: int) -> list[str]:
        return [await self.fake.acks.get() for _ in range(count)]


@asynccontextmanager
async def burst(tmp_path: Path) -> AsyncIterator[Burst]:
    """A Socket Mode transport handing a real store's sink; yields once it runs."""
    database = tmp_path / "store.db"
    store = await SqlStore.open(f"sqlite+aiosqlite:///{database}")
    try:
        async with fake_slack() as fake:
            settings = SlackSettings(bot_token="b", app_token="a", api_url=fake.api_url)
            transport = SlackTransport(
                settings, [RoomBinding(RoomId(CHANNEL))], backoff=Backoff(base=0.01, cap=0.05)
            )
            sink = Sink(store)
            async with asyncio.TaskGroup() as tg:
                task = tg.create_task(transport.run(sink, asyncio.Event()))
                try:
                    async with asyncio.timeout(30):
                        yield Burst(fake, sink, database)
                finally:
                    task.cancel()
    finally:
        await store.close()


def _message(i: int, retry_attempt: int = 0) -> dict[str, object]:
    return message_envelope(f"E{i}", f"1.{i:06d}", f"m{i}", retry_attempt=retry_attempt)


async def test_redeliveries_within_a_burst_are_acked_and_recorded_once(tmp_path: Path) -> None:
    async with burst(tmp_path) as b:
        ws = await b.socket()
        for i in range(100):
            await ws.send_json(_message(i))
            if i:  # the one before again, as if its ack was lost
                await ws.send_json(_message(i - 1, retry_attempt=1))
        acks = await b.acks(199)
        recorded = [m.text for m in await b.sink.store.pending_messages()]
    assert recorded == [f"m{i}" for i in range(100)]
    assert sorted(set(acks)) == sorted(f"E{i}" for i in range(100))


async def test_the_in_flight_cap_holds_and_the_burst_past_it_completes(tmp_path: Path) -> None:
    """Past the cap the socket is not read: an envelope after the first IN_FLIGHT ones is
    handled only once one of them settled (its ack comes first)."""
    cap = socket_mode.IN_FLIGHT
    async with burst(tmp_path) as b:
        ws = await b.socket()
        b.sink.gate.clear()
        for i in range(cap):
            await ws.send_json(_message(i))
        # An event the bridge does not use: acked at once when read, whatever is before it.
        other = message_envelope("OTHER", "2.000000", "")
        other["payload"]["event"] = {"type": "reaction_added", "user": "U0ALICE"}
        await ws.send_json(other)
        for i in range(cap, 100):
            await ws.send_json(_message(i))
        await b.sink.until_in_flight(cap)
        b.sink.gate.set()
        acks = await b.acks(101)
        recorded = [m.text for m in await b.sink.store.pending_messages()]
    assert acks[0] != "OTHER"
    assert b.sink.most == cap
    assert recorded == [f"m{i}" for i in range(100)]
    assert sorted(acks) == sorted([f"E{i}" for i in range(100)] + ["OTHER"])


async def test_a_socket_dropped_mid_burst_loses_nothing(tmp_path: Path) -> None:
    """The store is held by another writer while the burst is in the sink; the socket
    drops: nothing is acked, and Slack's redelivery on the next connection is recorded
    once, in order."""
    async with burst(tmp_path) as b:
        busy = sqlite3.connect(b.database, isolation_level=None)
        try:
            ws = await b.socket()
            busy.execute("BEGIN IMMEDIATE")
            for i in range(50):
                await ws.send_json(_message(i))
            await b.sink.until_in_flight(50)
            await ws.close()
            busy.execute("ROLLBACK")
        finally:
            busy.close()
        second = await b.socket()
        assert b.fake.acks.empty()
        for i in range(50):
            await second.send_json(_message(i, retry_attempt=1))
        acks = await b.acks(50)
        recorded = [m.text for m in await b.sink.store.pending_messages()]
    assert recorded == [f"m{i}" for i in range(50)]
    assert sorted(acks) == sorted(f"E{i}" for i in range(50))

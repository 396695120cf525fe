"""Acknowledgements never wait behind a rate-limited reply or another event's hand-over.

Against :mod:`tests.transports.slack.fake_slack` (429s; a sink that can be held).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier

from bridge.core.model import Reply, ReplyKind, RoomId
from bridge.core.transport import Accepted, InboundEvent, RoomBinding, TransportError
from tests.transports.slack.fake_slack import (
    CHANNEL,
    HELLO,
    FakeSlack,
    fake_slack,
    message_envelope,
)
from tests.transports.slack.peer import free_port
from transports.backoff import Backoff
from transports.slack.settings import SlackSettings
from transports.slack.transport import HANDED_OVER, SlackTransport, settled

SECRET = "fake-signing-secret"


@dataclass
class CommandAnsweringSink:
    """Like the service's intake today: a command is answered before the sink returns."""

    transport: SlackTransport | None = None
    texts: list[str] = field(default_factory=list)
    hold: dict[str, asyncio.Event] = field(default_factory=dict)
    """Text -> event the hand-over of that text waits for."""
    entered: asyncio.Queue[str] = field(default_factory=asyncio.Queue)

    async def __call__(self, event: InboundEvent) -> Accepted:
        text = getattr(event, "text", "")
        await self.entered.put(text)
        if text in self.hold:
            await self.hold[text].wait()
        self.texts.append(text)
        if text.startswith("!") and self.transport is not None:
            # The service logs a failed answer; the outbox would retry it.
            with contextlib.suppress(TransportError):
                await self.transport.outbound.send(
                    Reply(event.room, "status: idle", ReplyKind.NOTICE)
                )
        return Accepted.ACCEPTED


async def test_a_rate_limited_command_answer_does_not_delay_later_acks() -> None:
    async with fake_slack() as fake:
        settings = SlackSettings(bot_token="b", app_token="a", api_url=fake.api_url)
        transport = SlackTransport(
            settings, [RoomBinding(RoomId(CHANNEL))], backoff=Backoff(base=0.01, cap=0.05)
        )
        sink = CommandAnsweringSink(transport)
        fake.rate_limited["chat.postMessage"] = [30]
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(transport.run(sink, asyncio.Event()))
            async with asyncio.timeout(10):
                ws = await fake.sockets.get()
            await ws.send_json(HELLO)
            await ws.send_json(message_envelope("E1", "1.000001", "!status"))
            await ws.send_json(message_envelope("E2", "1.000002", "next"))
            async with asyncio.timeout(10):  # not 30 s behind the Retry-After
                acks = [await fake.acks.get(), await fake.acks.get()]
            task.cancel()
    # Envelopes settle concurrently: "next" need not even wait for the command.
    assert sorted(acks) == ["E1", "E2"]
    assert sink.texts == ["!status", "next"]
    assert fake.calls_to("chat.postMessage") == 1


def signed(body: str) -> dict[str, str]:
    timestamp = str(int(time.time()))  # Slack signs with the current Unix time
    signature = SignatureVerifier(SECRET).generate_signature(timestamp=timestamp, body=body)
    return {
        "Content-Type": "application/json",
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": str(signature),
    }


@asynccontextmanager
async def events_transport(
    sink: CommandAnsweringSink,
) -> AsyncIterator[tuple[SlackTransport, FakeSlack]]:
    """An events-mode transport on a free port, listening, against the Slack stand-in."""
    async with fake_slack() as fake:
        settings = SlackSettings(
            mode="events",
            bot_token="b",
            signing_secret=SECRET,
            api_url=fake.api_url,
            listen=f"127.0.0.1:{free_port()}",
        )
        transport = SlackTransport(settings, [RoomBinding(RoomId(CHANNEL))])
        ready = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(transport.run(sink, ready))
            async with asyncio.timeout(10):
                await ready.wait()
            try:
                yield transport, fake
            finally:
                task.cancel()


async def deliver(transport: SlackTransport, ts: str, text: str) -> int:
    body = json.dumps(message_envelope(f"E{ts}", ts, text)["payload"])
    url = f"http://127.0.0.1:{transport.events_port}/slack/events"
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, data=body, headers=signed(body)) as r,
    ):
        return r.status


async def test_one_slow_hand_over_does_not_hold_up_another_channel_event() -> None:
    sink = CommandAnsweringSink(hold={"slow": asyncio.Event()})
    async with events_transport(sink) as (transport, _), asyncio.TaskGroup() as tg:
        slow = tg.create_task(deliver(transport, "1.000001", "slow"))
        async with asyncio.timeout(10):
            assert await sink.entered.get() == "slow"
            assert await deliver(transport, "1.000002", "quick") == 200
        assert sink.texts == ["quick"]
        sink.hold["slow"].set()
        assert await slow == 200
    assert sink.texts == ["quick", "slow"]


async def test_a_failing_auth_test_after_connecting_neither_acks_nor_drops() -> None:
    """The first event after a connect hands over even if auth.test would now fail.

    Bolt used to make its own ``auth.test`` on that event and, on a 429,
    answer 200: the envelope was acknowledged and the message never reached
    the sink. The transport's identity from connecting is all Bolt needs.
    """
    async with fake_slack() as fake:
        settings = SlackSettings(bot_token="b", app_token="a", api_url=fake.api_url)
        transport = SlackTransport(
            settings, [RoomBinding(RoomId(CHANNEL))], backoff=Backoff(base=0.01, cap=0.05)
        )
        sink = CommandAnsweringSink()
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(transport.run(sink, asyncio.Event()))
            async with asyncio.timeout(10):
                ws = await fake.sockets.get()
            fake.rate_limited["auth.test"] = [1]  # the transport's own call is behind us
            await ws.send_json(HELLO)
            await ws.send_json(message_envelope("E1", "1.000001", "please do X"))
            async with asyncio.timeout(10):
                assert await fake.acks.get() == "E1"
            task.cancel()
    assert sink.texts == ["please do X"]
    assert fake.calls_to("auth.test") == 1


async def test_events_api_a_failing_auth_test_does_not_answer_200_without_hand_over() -> None:
    sink = CommandAnsweringSink()
    async with events_transport(sink) as (transport, fake):
        fake.rate_limited["auth.test"] = [1]
        status = await deliver(transport, "1.000001", "please do X")
    assert status == 200
    assert sink.texts == ["please do X"]


def test_a_200_for_an_event_no_listener_finished_is_not_settled() -> None:
    """Whatever Bolt answers, an event counts as handled only once a listener finished it."""
    event = message_envelope("E1", "1.000001", "hi")["payload"]
    request = AsyncBoltRequest(mode="socket_mode", body=event, headers={})
    assert not settled(request, 200)  # e.g. Bolt's authorization failed
    request.context[HANDED_OVER] = True
    assert settled(request, 200)
    assert not settled(request, 500)
    command = AsyncBoltRequest(mode="socket_mode", body={"command": "/x"}, headers={})
    assert settled(command, 404)  # nothing the bridge serves: do not have it resent


async def test_slow_display_name_lookups_do_not_add_up_along_queued_envelopes() -> None:
    """Socket Mode serves envelopes one at a time; each names a user users.info never answers.

    Per-lookup timeouts alone added up (six envelopes, six waits) past Slack's
    3 s deadline; the shared wait budget makes the later ones show the id at once.
    """
    async with fake_slack() as fake:
        fake.users_info_hangs = True
        settings = SlackSettings(bot_token="b", app_token="a", api_url=fake.api_url)
        transport = SlackTransport(
            settings, [RoomBinding(RoomId(CHANNEL))], backoff=Backoff(base=0.01, cap=0.05)
        )
        sink = CommandAnsweringSink()
        envelopes = [f"E{i}" for i in range(6)]
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(transport.run(sink, asyncio.Event()))
            async with asyncio.timeout(10):
                ws = await fake.sockets.get()
            await ws.send_json(HELLO)
            for i, envelope in enumerate(envelopes):
                await ws.send_json(message_envelope(envelope, f"1.00000{i}", f"ask <@U0USER{i}>"))
            async with asyncio.timeout(30):
                acks = [await fake.acks.get() for _ in envelopes]
            task.cancel()
    assert acks == envelopes
    assert sink.texts == [f"ask @U0USER{i}" for i in range(6)]
    assert fake.calls_to("users.info") < len(envelopes)

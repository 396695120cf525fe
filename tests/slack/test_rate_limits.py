"""429 with Retry-After, against a local server that answers 429 first."""

from __future__ import annotations

import pytest

from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomId, RoomKey, TransportName
from bridge.core.transport import RoomBinding, RunPhase, TransportError
from tests.slack.fake_slack import CHANNEL, fake_slack
from transports.slack.settings import SlackSettings
from transports.slack.transport import SlackTransport
from transports.slack.web import web_client

ROOM = RoomKey(TransportName("slack"), RoomId(CHANNEL))


class RecordingSleep:
    """Stands in for asyncio.sleep: records the wait instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def transport(
    api_url: str, sleep: RecordingSleep | None = None, retries: int = 4
) -> SlackTransport:
    settings = SlackSettings(
        bot_token="xoxb-x", app_token="xapp-x", api_url=api_url, rate_limit_retries=retries
    )
    if sleep is None:
        return SlackTransport(settings, [RoomBinding(RoomId(CHANNEL))])
    return SlackTransport(settings, [RoomBinding(RoomId(CHANNEL))], sleep=sleep)


async def test_retry_after_is_waited_exactly_then_the_call_succeeds() -> None:
    async with fake_slack() as fake:
        fake.rate_limited["chat.postMessage"] = [1, 3]
        sleep = RecordingSleep()
        posted = await transport(fake.api_url, sleep).send(Reply(ROOM, "hi", ReplyKind.RESULT))
    assert posted is not None
    assert sleep.delays == [1.0, 3.0]
    assert fake.calls_to("chat.postMessage") == 3


async def test_a_zero_retry_after_retries_at_once_with_the_real_sleep() -> None:
    async with fake_slack() as fake:
        fake.rate_limited["reactions.add"] = [0]
        await transport(fake.api_url).set_phase(
            ROOM, [ExternalMessageId("1.000001")], RunPhase.RECEIVED
        )
    assert fake.calls_to("reactions.add") == 2


async def test_retries_are_bounded_then_the_error_surfaces() -> None:
    async with fake_slack() as fake:
        fake.rate_limited["chat.postMessage"] = [0] * 10
        sleep = RecordingSleep()
        with pytest.raises(TransportError, match="ratelimited"):
            await transport(fake.api_url, sleep, retries=2).send(Reply(ROOM, "hi"))
    assert fake.calls_to("chat.postMessage") == 3
    assert sleep.delays == [0.0, 0.0]


async def test_the_client_alone_honours_retry_after() -> None:
    async with fake_slack() as fake:
        fake.rate_limited["auth.test"] = [2]
        sleep = RecordingSleep()
        client = web_client("xoxb-x", fake.api_url, rate_limit_retries=1, sleep=sleep)
        response = await client.auth_test()
    assert response["ok"]
    assert sleep.delays == [2.0]

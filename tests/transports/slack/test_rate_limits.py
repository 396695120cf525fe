"""429s and refusals become the transport contract's errors; nothing sleeps.

Against :mod:`tests.transports.slack.fake_slack`: local-slack never answers 429.
"""

from __future__ import annotations

import logging

import pytest

from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomId, RoomKey, TransportName
from bridge.core.transport import (
    RateLimited,
    RoomBinding,
    RunPhase,
    TransportError,
    Undeliverable,
)
from tests.transports.slack.fake_slack import CHANNEL, fake_slack
from transports.slack.settings import SlackSettings
from transports.slack.transport import SlackTransport

ROOM = RoomKey(TransportName("slack"), RoomId(CHANNEL))


def transport(api_url: str) -> SlackTransport:
    settings = SlackSettings(bot_token="xoxb-x", app_token="xapp-x", api_url=api_url)
    return SlackTransport(settings, [RoomBinding(RoomId(CHANNEL))])


async def test_a_429_raises_rate_limited_with_retry_after_and_is_not_retried() -> None:
    async with fake_slack() as fake:
        fake.rate_limited["chat.postMessage"] = [30]
        with pytest.raises(RateLimited) as caught:
            await transport(fake.api_url).outbound.send(Reply(ROOM, "hi", ReplyKind.RESULT))
    assert caught.value.retry_after_s == 30.0
    assert fake.calls_to("chat.postMessage") == 1


async def test_rate_limited_reactions_and_edits_raise_at_once() -> None:
    async with fake_slack() as fake:
        fake.rate_limited["reactions.add"] = [5]
        fake.rate_limited["chat.update"] = [7]
        slack = transport(fake.api_url)
        with pytest.raises(RateLimited):
            await slack.outbound.set_phase(ROOM, [ExternalMessageId("1.000001")], RunPhase.RECEIVED)
        with pytest.raises(RateLimited):
            await slack.outbound.edit(ROOM, ExternalMessageId("1.000001"), "progress")
    assert fake.calls_to("reactions.add") == 1
    assert fake.calls_to("chat.update") == 1


@pytest.mark.parametrize(
    "code",
    [
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "msg_too_long",
        "invalid_arguments",
        "thread_not_found",
    ],
)
async def test_permanent_refusals_are_undeliverable(code: str) -> None:
    async with fake_slack() as fake:
        fake.errors["chat.postMessage"] = [code]
        with pytest.raises(Undeliverable, match=code):
            await transport(fake.api_url).outbound.send(Reply(ROOM, "hi"))


@pytest.mark.parametrize(
    "code", ["invalid_auth", "token_revoked", "account_inactive", "missing_scope"]
)
async def test_a_refused_token_is_undeliverable_and_logged_loudly(
    code: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The outbox would retry forever, holding up every later answer of the room."""
    async with fake_slack() as fake:
        fake.errors["chat.postMessage"] = [code]
        with pytest.raises(Undeliverable, match=code):
            await transport(fake.api_url).outbound.send(Reply(ROOM, "hi"))
    assert [r.levelno for r in caplog.records if code in r.getMessage()] == [logging.ERROR]


async def test_other_errors_are_transport_errors_to_retry() -> None:
    async with fake_slack() as fake:
        fake.errors["chat.postMessage"] = ["some_error_slack_adds_later"]
        with pytest.raises(TransportError) as caught:
            await transport(fake.api_url).outbound.send(Reply(ROOM, "hi"))
    assert not isinstance(caught.value, RateLimited | Undeliverable)

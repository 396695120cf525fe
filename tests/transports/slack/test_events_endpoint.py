"""Events mode specifics against local-slack: redeliveries and request verification."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bridge.core.http_limits import ClientLimits
from tests.transports.slack import peer
from tests.transports.slack.events import signed
from tests.transports.slack.harness import Running, running

pytestmark = pytest.mark.slack


async def post(env: Running, body: str, headers: dict[str, str]) -> tuple[int, str]:
    url = f"http://127.0.0.1:{env.transport.events_port}/slack/events"
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as r:
        return r.status, await r.text()


async def delivered_body(env: Running) -> str:
    """The signed body local-slack POSTed for the last event."""
    posts = [e for e in await env.slack.log() if e["direction"] == "to_bot"]
    return str(posts[-1]["detail"])


@pytest.fixture
async def events(tmp_path: Path) -> AsyncIterator[Running]:
    async with running(tmp_path, "events") as env:
        yield env


async def test_a_redelivered_event_is_handed_over_once(events: Running) -> None:
    await events.slack.post_message(peer.ALICE, "do it once")
    body = await delivered_body(events)
    retry = {**signed(body), "X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
    assert (await post(events, body, retry))[0] == 200
    # The same message as an app_mention (Slack sends both when subscribed to both).
    mention = json.loads(body)
    mention["event"]["type"] = "app_mention"
    mention["event_id"] = "Ev0OTHER"
    mention_body = json.dumps(mention)
    assert (await post(events, mention_body, signed(mention_body)))[0] == 200
    assert events.sink.texts == ["do it once"]


async def test_forged_and_stale_requests_are_refused(events: Running) -> None:
    await events.slack.post_message(peer.ALICE, "genuine")
    body = json.loads(await delivered_body(events))
    body["event"]["ts"] = "1700000000.000001"
    body["event"]["text"] = "forged"
    forged = json.dumps(body)
    assert (await post(events, forged, signed(forged, secret="not-the-secret")))[0] == 401
    assert (await post(events, forged, signed(forged, age_s=600)))[0] == 401
    assert (await post(events, forged, {"Content-Type": "application/json"}))[0] == 401
    assert events.sink.texts == ["genuine"]


async def test_url_verification_is_answered(events: Running) -> None:
    body = json.dumps({"type": "url_verification", "challenge": "c-123", "token": "t"})
    status, text = await post(events, body, signed(body))
    assert status == 200
    assert "c-123" in text
    assert events.sink.received == []


async def test_the_endpoint_holds_its_clients_to_the_http_limits_it_is_given(
    tmp_path: Path,
) -> None:
    # [http] max_connections and the deadlines bound this public listener too (docs/operations.md).
    async with running(tmp_path, "events", limits=ClientLimits(max_connections=2)) as env:
        port = env.transport.events_port
        assert port is not None
        oldest_reader, oldest_writer = await asyncio.open_connection("127.0.0.1", port)
        _, newer_writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"type": "url_verification", "challenge": "c-1", "token": "t"})
        assert (await post(env, body, signed(body)))[0] == 200  # a third: the oldest made room
        oldest_writer.write(b"GET /slack/events HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await oldest_reader.read() == b""
        oldest_writer.close()
        newer_writer.close()


async def test_a_body_that_is_no_slack_request_is_400_without_an_error_logged(
    events: Running, caplog: pytest.LogCaptureFixture
) -> None:
    # Unsigned garbage is a client's error: neither a 500 nor a traceback in the log.
    port = events.transport.events_port
    assert port is not None
    bodies = [
        (b"\xff\xfe", "application/json", b"400 Bad Request"),  # not UTF-8
        (b"payload=%7B", "application/x-www-form-urlencoded", b"400 Bad Request"),  # not JSON
        # Read as UTF-8, as Slack sends it, whatever the header says: then unsigned.
        (b"{}", "application/json; charset=no-such-charset", b"401 Unauthorized"),
    ]
    caplog.set_level(logging.WARNING)
    for body, kind, status in bodies:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /slack/events HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (kind.encode(), len(body), body)
        )
        answer = await reader.read()
        writer.close()
        assert answer.split(b"\r\n")[0] == b"HTTP/1.1 " + status, body
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert events.sink.texts == []

"""A Slack file server that stalls: the run's preparation gives the file up in
bounded time (through the real transport and a real HTTP server on loopback)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from bridge.core.model import (
    Attachment,
    Batch,
    ExternalMessageId,
    Message,
    MessageId,
    RoomId,
    RoomKey,
    RunId,
    TransportName,
    UserId,
)
from bridge.core.transport import RoomBinding
from bridge.metrics import Metrics
from bridge.runs.inbox import FileLimits, Inbox
from transports.slack.settings import SlackSettings
from transports.slack.transport import SlackTransport

ROOM = RoomKey(TransportName("slack"), RoomId("C1"))


@asynccontextmanager
async def stalling_server(trickle: bool) -> AsyncIterator[str]:
    """Answers 200 with headers, then never sends the body (or one byte now and then)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "1000"})
        await response.prepare(request)
        while True:
            if trickle:
                await response.write(b"x")
            await asyncio.sleep(0.05)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/api/"
    finally:
        await runner.cleanup()


def batch_with(*files: Attachment) -> Batch:
    message = Message(
        MessageId(1), ROOM, UserId("U1"), "", ExternalMessageId("1.0"), 0.0, attachments=files
    )
    return Batch(ROOM, (message,))


async def fetch_from_stalling_server(tmp_path: Path, *, trickle: bool) -> None:
    async with stalling_server(trickle) as api_url:
        settings = SlackSettings(bot_token="xoxb-t", app_token="xapp-t", api_url=api_url)
        transport = SlackTransport(settings, [RoomBinding(RoomId("C1"))])
        metrics = Metrics()
        inbox = Inbox({TransportName("slack"): transport}, metrics, fetch_timeout_s=0.5)
        stalled = Attachment("big.bin", "application/octet-stream", 1000, api_url + "files/F1")
        async with asyncio.timeout(30):
            [file] = await inbox.fetch(
                RunId("run-1"), batch_with(stalled), tmp_path, FileLimits(10_000, 10_000)
            )
    assert file.path is None
    assert file.missing_reason == "could not be downloaded (the download timed out)"
    assert list((tmp_path / ".chatbridge" / "inbox" / "run-1").iterdir()) == []


async def test_a_file_whose_body_never_comes_is_given_up(tmp_path: Path) -> None:
    await fetch_from_stalling_server(tmp_path, trickle=False)


async def test_a_file_that_trickles_forever_is_given_up(tmp_path: Path) -> None:
    await fetch_from_stalling_server(tmp_path, trickle=True)


async def test_the_files_of_a_run_together_are_given_up_in_bounded_time(tmp_path: Path) -> None:
    """Each file within its own limit, but many of them: the run still starts soon."""
    async with stalling_server(trickle=True) as api_url:
        settings = SlackSettings(bot_token="xoxb-t", app_token="xapp-t", api_url=api_url)
        transport = SlackTransport(settings, [RoomBinding(RoomId("C1"))])
        inbox = Inbox(
            {TransportName("slack"): transport},
            Metrics(),
            fetch_timeout_s=3600.0,
            fetch_total_s=0.5,
        )
        stalled = [
            Attachment(f"f{n}.bin", "application/octet-stream", 10, api_url + f"files/F{n}")
            for n in range(3)
        ]
        async with asyncio.timeout(30):
            files = await inbox.fetch(
                RunId("run-1"), batch_with(*stalled), tmp_path, FileLimits(10_000, 10_000)
            )
    assert [f.missing_reason for f in files] == [
        "could not be downloaded (the download timed out)"
    ] * 3
    assert list((tmp_path / ".chatbridge" / "inbox" / "run-1").iterdir()) == []

"""Failure paths Synapse cannot be made to produce on demand, against a scripted homeserver.

The stub is a real HTTP server on loopback speaking just enough of the
client-server API; each test scripts its ``/sync`` answers.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bridge.core.model import InboundMessage, Reply, RoomId, RoomKey, TransportName
from bridge.core.transport import (
    Accepted,
    InboundEvent,
    RoomBinding,
    SinkClosed,
    TransportError,
)
from tests.transports.matrix.matrix_helpers import RecordingSink
from tests.transports.matrix.synapse_peer import free_port
from transports.backoff import Backoff
from transports.matrix import MatrixSettings, MatrixTransport

BOT = "@bot:stub"
ROOM = "!room:stub"
SyncScript = Callable[[int, web.Request], Awaitable[web.StreamResponse]]


class ObservedBackoff(Backoff):
    """A fast backoff that tells the test each time the transport backs off."""

    def __init__(self) -> None:
        super().__init__(base=0.01, cap=0.02)
        self.backed_off = asyncio.Event()
        self.total = 0

    def next_delay(self) -> float:
        self.total += 1
        self.backed_off.set()
        return super().next_delay()


def error(status: int, code: str, **extra: object) -> web.Response:
    return web.json_response({"errcode": code, "error": "scripted", **extra}, status=status)


def sync_body(batch: str, events: list[dict[str, Any]] | None = None) -> web.Response:
    body: dict[str, Any] = {"next_batch": batch}
    if events:
        body["rooms"] = {"join": {ROOM: {"timeline": {"events": events, "limited": False}}}}
    return web.json_response(body)


def text_event(event_id: str, body: str) -> dict[str, Any]:
    return {
        "type": "m.room.message",
        "event_id": event_id,
        "sender": "@alice:stub",
        "origin_server_ts": 1,
        "content": {"msgtype": "m.text", "body": body},
    }


async def hold(request: web.Request) -> web.Response:
    """A long poll that never answers: the transport is idle and connected."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


@pytest.fixture
async def homeserver() -> AsyncIterator[Callable[[SyncScript], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(script: SyncScript) -> str:
        calls = 0

        async def sync(request: web.Request) -> web.StreamResponse:
            nonlocal calls
            calls += 1
            return await script(calls, request)

        async def whoami(request: web.Request) -> web.Response:
            return web.json_response({"user_id": BOT, "device_id": "STUBDEV"})

        async def keys_upload(request: web.Request) -> web.Response:
            return web.json_response({"one_time_key_counts": {"signed_curve25519": 50}})

        async def room_send(request: web.Request) -> web.Response:
            return web.json_response({"event_id": f"$sent-{request.match_info['txn']}"})

        app = web.Application()
        app.router.add_get("/_matrix/client/v3/sync", sync)
        app.router.add_put("/_matrix/client/v3/rooms/{room}/send/{type}/{txn}", room_send)
        app.router.add_get("/_matrix/client/v3/account/whoami", whoami)
        app.router.add_post("/_matrix/client/v3/keys/upload", keys_upload)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        runners.append(runner)
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def transport(url: str, store: Path, backoff: Backoff) -> MatrixTransport:
    settings = MatrixSettings.model_validate(
        {"homeserver": url, "user_id": BOT, "access_token": "stub-token", "store_path": store}
    )
    return MatrixTransport(settings, [RoomBinding(RoomId(ROOM))], backoff=backoff)


async def run_until(task_ready: asyncio.Event, task: asyncio.Task[None]) -> None:
    async with asyncio.timeout(30):
        await asyncio.wait(
            [task, asyncio.create_task(task_ready.wait())], return_when=asyncio.FIRST_COMPLETED
        )
    if task.done():
        task.result()


async def cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_error_responses_back_off_and_recover(
    homeserver: Callable[[SyncScript], Awaitable[str]], tmp_path: Path
) -> None:
    async def script(call: int, request: web.Request) -> web.StreamResponse:
        if call <= 2:
            return error(502, "M_UNKNOWN")
        if call <= 6:
            # Rate limits are waited out inside nio (retry_after_ms), three times
            # in a row at most; the fourth comes back to our loop as an error object.
            return error(429, "M_LIMIT_EXCEEDED", retry_after_ms=1)
        return sync_body("s1") if call == 7 else await hold(request)

    backoff = ObservedBackoff()
    bridge = transport(await homeserver(script), tmp_path, backoff)
    ready = asyncio.Event()
    task = asyncio.create_task(bridge.run(RecordingSink(), ready))
    await run_until(ready, task)
    assert bridge.connected
    assert backoff.total >= 3  # each error object was answered with a backoff
    assert backoff.failures == 0  # and the success reset it
    await cancel(task)
    assert not bridge.connected
    # Written off the loop, and at the latest when the transport stops.
    assert (tmp_path / "sync_position").read_text() == "s1"


async def test_unreachable_server_retries_until_cancelled(tmp_path: Path) -> None:
    backoff = ObservedBackoff()
    bridge = transport(f"http://127.0.0.1:{free_port()}", tmp_path, backoff)
    ready = asyncio.Event()
    task = asyncio.create_task(bridge.run(RecordingSink(), ready))
    async with asyncio.timeout(30):
        while backoff.total < 3:
            backoff.backed_off.clear()
            await backoff.backed_off.wait()
    assert not ready.is_set()
    assert not bridge.connected
    await cancel(task)


async def test_position_moves_only_after_the_sink_accepted(
    homeserver: Callable[[SyncScript], Awaitable[str]], tmp_path: Path
) -> None:
    (tmp_path / "sync_position").write_text("s0")
    events = [text_event("$1", "one"), text_event("$2", "two")]
    since: list[str | None] = []

    async def script(call: int, request: web.Request) -> web.StreamResponse:
        since.append(request.query.get("since"))
        return sync_body("s1", events) if call <= 2 else await hold(request)

    delivered: list[InboundMessage] = []
    failures = 0

    async def flaky_sink(message: InboundEvent) -> Accepted:
        nonlocal failures
        assert isinstance(message, InboundMessage)  # the script sends only messages
        if message.text == "two" and failures == 0:
            failures += 1
            raise RuntimeError("store briefly unavailable")
        delivered.append(message)
        return Accepted.ACCEPTED

    bridge = transport(await homeserver(script), tmp_path, ObservedBackoff())
    ready = asyncio.Event()
    task = asyncio.create_task(bridge.run(flaky_sink, ready))
    await run_until(ready, task)
    await cancel(task)
    # The failed batch was fetched again from the old position and redelivered whole;
    # the service drops the duplicate "one".
    assert since[:2] == ["s0", "s0"]
    assert [m.text for m in delivered] == ["one", "one", "two"]
    assert (tmp_path / "sync_position").read_text() == "s1"


async def test_closed_sink_leaves_the_position_and_keeps_the_client_sending(
    homeserver: Callable[[SyncScript], Awaitable[str]], tmp_path: Path
) -> None:
    (tmp_path / "sync_position").write_text("s0")
    since: list[str | None] = []
    polled_on = asyncio.Event()

    async def script(call: int, request: web.Request) -> web.StreamResponse:
        since.append(request.query.get("since"))
        if call == 1:
            return sync_body("s1", [text_event("$1", "one")])
        polled_on.set()
        return await hold(request)

    offered: list[InboundEvent] = []

    async def closed_sink(event: InboundEvent) -> Accepted:
        offered.append(event)
        raise SinkClosed

    bridge = transport(await homeserver(script), tmp_path, ObservedBackoff())
    task = asyncio.create_task(bridge.run(closed_sink, asyncio.Event()))
    async with asyncio.timeout(30):
        await polled_on.wait()
    # Shutting down, the service still answers the runs of its grace period.
    sent = await bridge.outbound.send(
        Reply(RoomKey(TransportName("matrix"), RoomId(ROOM)), "answer")
    )
    assert sent is not None
    assert sent.startswith("$sent-")
    assert not task.done()
    await cancel(task)
    # The refused message is not acknowledged: the next start syncs from s0 again.
    assert (tmp_path / "sync_position").read_text() == "s0"
    assert since == ["s0", "s1"]
    assert len(offered) == 1
    assert bridge.reconnects == 0


async def test_revoked_token_during_sync_ends_the_transport(
    homeserver: Callable[[SyncScript], Awaitable[str]], tmp_path: Path
) -> None:
    async def script(call: int, request: web.Request) -> web.StreamResponse:
        return error(401, "M_UNKNOWN_TOKEN")

    backoff = ObservedBackoff()
    bridge = transport(await homeserver(script), tmp_path, backoff)
    with pytest.raises(TransportError, match="M_UNKNOWN_TOKEN"):
        async with asyncio.timeout(30):
            await bridge.run(RecordingSink(), asyncio.Event())
    assert backoff.total == 0  # no retry can bring a revoked token back


RESPONSES = {"s0": ("s1", ["m1", "m2"]), "s1": ("s2", ["m3", "m4"]), "s2": ("s3", ["m5"])}
"""The scripted history: a sync from each position, and the messages it brings."""


async def crash_child(url: str, store: Path, record: Path, step: str) -> int:
    """Run :mod:`tests.transports.matrix.crash_child` to its end (a crash or position s3); its
    status."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.transports.matrix.crash_child",
        url,
        str(store),
        str(record),
        step,
        "s3",
        cwd=Path(__file__).parents[3],
    )
    try:
        async with asyncio.timeout(60):
            return await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    "step",
    [
        *("accepting:m1", "accepted:m2", "accepting:m4", "accepted:m4"),
        *("saving:1", "saved:1", "saving:2", "saved:2"),
    ],
)
async def test_a_crash_at_any_step_loses_no_message_and_the_position_is_never_ahead(
    homeserver: Callable[[SyncScript], Awaitable[str]], tmp_path: Path, step: str
) -> None:
    """A process killed (SIGKILL) while accepting, after accepting, while saving the
    position or after: the saved position never passes a message not yet recorded,
    and the restarted process delivers every message, in order."""
    store, record = tmp_path / "store", tmp_path / "recorded"
    store.mkdir()
    (store / "sync_position").write_text("s0")
    since: list[str | None] = []

    async def script(call: int, request: web.Request) -> web.StreamResponse:
        token = request.query.get("since")
        since.append(token)
        if token not in RESPONSES:
            return await hold(request)
        batch, texts = RESPONSES[token]
        return sync_body(batch, [text_event(f"${t}", t) for t in texts])

    url = await homeserver(script)
    assert await crash_child(url, store, record, step) == -signal.SIGKILL
    recorded = record.read_text().split() if record.exists() else []
    saved = (store / "sync_position").read_text()
    behind = [t for token, (batch, texts) in RESPONSES.items() if batch <= saved for t in texts]
    assert set(behind) <= set(recorded), f"position {saved} is ahead of {recorded}"

    since.clear()
    assert await crash_child(url, store, record, "none") == 0
    # The restart resumes from the saved position; when the crash came right after
    # the final position was written (saves coalesce, so the second write may be
    # s3 itself), there is nothing left to sync.
    assert since[:1] == ([] if saved == "s3" else [saved])
    assert list(dict.fromkeys(record.read_text().split())) == ["m1", "m2", "m3", "m4", "m5"]

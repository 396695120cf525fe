from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from bridge import service as service_module
from bridge.config import load_settings
from bridge.core.hostport import HostPort
from bridge.core.transport import InboundSink
from bridge.errors import StartupError
from bridge.http import serve_http
from bridge.service import Service, open_store
from tests.bridge.harness import write_config
from transports.base import Transport


async def get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


async def test_readyz_is_503_with_the_reason_until_ready() -> None:
    reason: str | None = "matrix: not connected"
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def readiness() -> str | None:
        return reason

    server = asyncio.create_task(
        serve_http(HostPort("127.0.0.1", 0), readiness, lambda: b"# metrics\n", bound.set_result)
    )
    try:
        port = await bound
        assert await get(port, "/readyz") == (503, "not ready: matrix: not connected\n")
        assert (await get(port, "/healthz"))[0] == 200
        reason = None
        assert await get(port, "/readyz") == (200, "ready\n")
        status, text = await get(port, "/metrics")
        assert status == 200
        assert text == "# metrics\n"
    finally:
        server.cancel()
        await asyncio.wait({server})


class Disconnected(Transport):
    name = "slack"  # type: ignore[assignment]

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        await asyncio.Event().wait()

    @property
    def connected(self) -> bool:
        return False


async def test_service_readiness_names_the_store_or_the_transport(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    store = await open_store(settings)
    service = Service(settings, store, [Disconnected()])
    assert await service.readiness() == "slack: not connected"
    await store.close()
    reason = await service.readiness()
    assert reason is not None
    assert reason.startswith("store: ")


async def raw_exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await reader.read()  # the server closes after one response
    finally:
        writer.close()
        await writer.wait_closed()


async def test_unknown_paths_methods_and_oversized_heads_are_refused() -> None:
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def readiness() -> str | None:
        return None

    server = asyncio.create_task(
        serve_http(HostPort("127.0.0.1", 0), readiness, lambda: b"", bound.set_result)
    )
    try:
        port = await bound
        assert (await get(port, "/nothing"))[0] == 404
        assert (await get(port, "/readyz?verbose=1")) == (200, "ready\n")
        post = await raw_exchange(port, b"POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert post.startswith(b"HTTP/1.1 405 ")
        head = await raw_exchange(port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert head.endswith(b"\r\n\r\n")  # no body after a HEAD
        garbage = await raw_exchange(port, b"hello\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400 ")
        huge = await raw_exchange(
            port, b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n"
        )
        assert huge.startswith(b"HTTP/1.1 431 ")
    finally:
        server.cancel()
        await asyncio.wait({server})


async def test_a_transport_that_never_connects_fails_the_start_naming_what_to_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real limit is a minute: the start-up's own clock is what is under test, not its length.
    monkeypatch.setattr(service_module, "READY_TIMEOUT_S", 0.1)
    settings = load_settings(write_config(tmp_path))
    store = await open_store(settings)
    try:
        service = Service(settings, store, [Disconnected()])
        with pytest.raises(ExceptionGroup) as caught:
            await service.serve()
    finally:
        await store.close()
    [error] = caught.value.exceptions
    assert isinstance(error, StartupError)
    assert str(error) == "not started within 0.1s: slack (check slack.api_url)"
    assert not service.ready.is_set()

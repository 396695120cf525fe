from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from bridge.config import load_settings
from bridge.core.hostport import HostPort
from bridge.core.transport import InboundSink
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

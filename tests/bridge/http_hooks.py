"""The HTTP endpoint served on a free port with hooks the test controls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

from bridge.core.hostport import HostPort
from bridge.core.http_limits import ClientLimits
from bridge.host.http import DEFAULT_LIMITS, Readiness, Response, serve_http
from bridge.host.http_sockets import bind_http


async def always_ready() -> str | None:
    return None


class Hooks:
    """A webhook at /hooks/a answering 202 (what bridge/automation/webhooks.py decides is tested
    elsewhere)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def paths(self) -> list[str]:
        return ["/hooks/a"]

    def body_limit(self, path: str) -> int | None:
        return 1 << 20 if path == "/hooks/a" else None

    def too_large(self, path: str) -> Response:
        return 413, b"body too large\n", "text/plain"

    async def deliver(self, path: str, headers: Mapping[str, str], body: bytes) -> Response:
        self.bodies.append(body)
        return 202, b"accepted\n", "text/plain"


@asynccontextmanager
async def serving(
    readiness: Readiness = always_ready,
    exposition: Callable[[], bytes] = lambda: b"",
    *,
    limits: ClientLimits = DEFAULT_LIMITS,
    webhooks: Hooks | None = None,
) -> AsyncIterator[int]:
    """One listener for all endpoints on 127.0.0.1, any port; yields the port, then stops it."""
    address = HostPort("127.0.0.1", 0)
    sockets = bind_http(address, address)
    server = asyncio.create_task(
        serve_http(sockets, readiness, exposition, webhooks=webhooks, limits=limits)
    )
    try:
        port = sockets.private_port
        assert port is not None
        yield port
    finally:
        server.cancel()
        await asyncio.wait({server})

"""``/healthz``, ``/readyz`` and ``/metrics`` over aiohttp."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from bridge.core.hostport import HostPort
from bridge.errors import StartupError

Readiness = Callable[[], Awaitable[str | None]]
"""Returns None when ready, else the reason it is not."""


def make_app(readiness: Readiness, exposition: Callable[[], bytes]) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        reason = await readiness()
        if reason is None:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=f"not ready: {reason}\n")

    async def metrics(_: web.Request) -> web.Response:
        response = web.Response(body=exposition())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def serve_http(
    listen: HostPort,
    readiness: Readiness,
    exposition: Callable[[], bytes],
    bound: Callable[[int], None],
) -> None:
    """Serve until cancelled; calls ``bound`` with the port once it listens (port 0: any)."""
    runner = web.AppRunner(make_app(readiness, exposition), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, listen.host, listen.port)
        try:
            await site.start()
        except OSError as exc:
            # The one line the operator sees: the setting, the address, the reason.
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise StartupError(f"http.listen = {listen}: cannot listen: {reason}") from None
        bound(runner.addresses[0][1])
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()

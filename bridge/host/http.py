"""The HTTP listeners: private (``/healthz``, ``/readyz``, ``/metrics``) and public (webhooks).

``[http] listen`` serves the private endpoints (and ``mounts``, sub-applications at a prefix,
behind the same limits); ``[http] public_listen`` the ``[[webhooks]]`` paths, whose bodies are
read bounded and handed to :class:`Webhooks`. Metrics are never on the public listener unless
both are one address. Served by bridge/core/web_server.py on sockets bound at start-up;
imported only once the service is ready (docs/operations.md, "The HTTP listeners").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from bridge.core.http_limits import ClientLimits
from bridge.core.web_server import listening, read_body
from bridge.host.http_sockets import HttpSockets

Readiness = Callable[[], Awaitable[str | None]]
"""Returns None when ready, else the reason it is not."""

Response = tuple[int, bytes, str]
"""(status, body, content type)"""

DEFAULT_LIMITS = ClientLimits()
AIOHTTP_BODY_CAP = 1 << 20
"""aiohttp's own default ``client_max_size``: what a mounted application's routes may read."""


class Webhooks(Protocol):
    """What the listener needs of bridge/automation/webhooks.py."""

    def paths(self) -> list[str]: ...

    def body_limit(self, path: str) -> int | None:
        """The largest body taken at ``path``; None: no webhook there."""
        ...

    def too_large(self, path: str) -> Response: ...

    async def deliver(self, path: str, headers: Mapping[str, str], body: bytes) -> Response: ...


def _response(answer: Response) -> web.Response:
    status, body, kind = answer
    return web.Response(status=status, body=body, headers={"Content-Type": kind})


def _add_private(
    app: web.Application,
    readiness: Readiness,
    exposition: Callable[[], bytes],
    mounts: Mapping[str, web.Application],
) -> None:
    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        reason = await readiness()
        if reason is None:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=f"not ready: {reason}\n")

    async def metrics(request: web.Request) -> web.Response:
        return _response((200, exposition(), CONTENT_TYPE_LATEST))

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    for prefix, sub in mounts.items():
        app.add_subapp(prefix, sub)


def _add_public(app: web.Application, webhooks: Webhooks) -> None:
    async def deliver(request: web.Request) -> web.Response:
        path = request.path
        limit = webhooks.body_limit(path) or 0  # routed here only for a webhook's path
        try:
            body = await read_body(request, limit)
        except web.HTTPRequestEntityTooLarge:
            return _response(webhooks.too_large(path))
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            # Joined as RFC 9110 (5.3) says, never one value picked: a proxy may read the
            # first and we the last, so a repeated signature must fail.
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        return _response(await webhooks.deliver(path, headers, body))

    for path in webhooks.paths():
        app.router.add_post(path, deliver)


def _body_cap(webhooks: Webhooks | None) -> int:
    """The applications' ``client_max_size``.

    aiohttp refuses a body over it whatever :func:`read_body` was given: the largest
    webhook's ``max_body_bytes`` (up to 64 MiB) must fit.
    """
    if webhooks is None:
        return AIOHTTP_BODY_CAP
    return max([AIOHTTP_BODY_CAP, *(webhooks.body_limit(p) or 0 for p in webhooks.paths())])


async def serve_http(
    sockets: HttpSockets,
    readiness: Readiness,
    exposition: Callable[[], bytes],
    *,
    webhooks: Webhooks | None = None,
    limits: ClientLimits = DEFAULT_LIMITS,
    mounts: Mapping[str, web.Application] | None = None,
) -> None:
    """Serve the bound ``sockets`` (bridge/host/http_sockets.py) until cancelled, then close
    them."""
    try:
        cap = _body_cap(webhooks)
        private = web.Application(client_max_size=cap) if sockets.private is not None else None
        if private is not None:
            _add_private(private, readiness, exposition, mounts or {})
        public = (
            private if sockets.public is sockets.private else web.Application(client_max_size=cap)
        )
        if public is not None and webhooks is not None:
            _add_public(public, webhooks)
        async with AsyncExitStack() as stack:
            if sockets.private is not None and private is not None:
                await stack.enter_async_context(listening(private, sockets.private, limits))
            if sockets.public is not None and public is not private and public is not None:
                await stack.enter_async_context(listening(public, sockets.public, limits))
            await asyncio.Event().wait()  # until cancelled
    finally:
        sockets.close()

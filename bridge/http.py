"""``/healthz``, ``/readyz`` and ``/metrics``: a small HTTP/1.1 responder on asyncio streams.

Three read-only GET endpoints need no web framework, and the one this project
has (aiohttp) costs more to import than the whole rest of a console start-up
spends on its HTTP listener; ``[http] listen`` is on by default, so that
import would be paid by every start. Each connection gets one response and
is closed (``Connection: close``, which every scraper and probe handles); a
request head is bounded in size and time, so a slow or oversized client
cannot hold a handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST

from bridge.core.hostport import HostPort
from bridge.errors import StartupError

Readiness = Callable[[], Awaitable[str | None]]
"""Returns None when ready, else the reason it is not."""

HEAD_LIMIT = 8192
"""Bytes of request line plus headers accepted; more is answered 431 and closed."""
HEAD_TIMEOUT_S = 10.0
"""A client must send its request head within this time."""

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}

Response = tuple[int, bytes, str]
"""(status, body, content type)"""


class _Endpoints:
    def __init__(self, readiness: Readiness, exposition: Callable[[], bytes]) -> None:
        self._readiness = readiness
        self._exposition = exposition

    async def answer(self, method: str, target: str) -> Response:
        path = target.partition("?")[0]
        if path not in ("/healthz", "/readyz", "/metrics"):
            return 404, b"not found\n", "text/plain"
        if method not in ("GET", "HEAD"):
            return 405, b"method not allowed\n", "text/plain"
        if path == "/healthz":
            return 200, b"ok\n", "text/plain"
        if path == "/metrics":
            return 200, self._exposition(), CONTENT_TYPE_LATEST
        reason = await self._readiness()
        if reason is None:
            return 200, b"ready\n", "text/plain"
        return 503, f"not ready: {reason}\n".encode(), "text/plain"


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str] | int:
    """The request's method and target, or the status to refuse it with."""
    try:
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        return 431
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return 400
    return parts[0], parts[1]


def _encode(status: int, body: bytes, content_type: str, *, with_body: bool) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1")
    return head + body if with_body else head


async def serve_http(
    listen: HostPort,
    readiness: Readiness,
    exposition: Callable[[], bytes],
    bound: Callable[[int], None],
) -> None:
    """Serve until cancelled; calls ``bound`` with the port once it listens (port 0: any).

    A port that cannot be bound is a :class:`StartupError` naming ``http.listen``.
    """
    endpoints = _Endpoints(readiness, exposition)
    handlers: set[asyncio.Task[object]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()  # always set: asyncio runs each connection in a task
        if task is not None:
            handlers.add(task)
        try:
            request = await _read_head(reader)
            if isinstance(request, int):
                status, body, kind, method = request, b"", "text/plain", "GET"
            else:
                method = request[0]
                status, body, kind = await endpoints.answer(*request)
            writer.write(_encode(status, body, kind, with_body=method != "HEAD"))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away or never finished its request
        finally:
            if task is not None:
                handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    try:
        server = await asyncio.start_server(handle, listen.host, listen.port, limit=HEAD_LIMIT)
    except OSError as exc:
        # The one line the operator sees: the setting, the address, the reason.
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise StartupError(f"http.listen = {listen}: cannot listen: {reason}") from None
    try:
        bound(server.sockets[0].getsockname()[1])
        await server.serve_forever()
    finally:
        server.close()
        # Connections in flight are this server's tasks: they end with it.
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()

"""``/healthz``, ``/readyz`` and ``/metrics``: a small HTTP/1.1 responder on asyncio streams.

Three read-only GET endpoints need no web framework, and the one this project
has (aiohttp) costs more to import than the whole rest of a console start-up
spends on its HTTP listener; ``[http] listen`` is on by default, so that
import would be paid by every start.

Each connection gets one response and is closed (``Connection: close``, which
every scraper and probe handles). What a client can hold is bounded, so that
a slow, idle or hostile client cannot starve the rest of the bridge of file
descriptors or keep probes out:

- a connection lives at most ``connection_timeout`` seconds (its head, the answer and
  the close together), then it is cut off;
- at most ``max_connections`` are open; one more makes room by closing the
  oldest that is not being answered (still sending its head, or done), so a
  probe that sends its request at once is answered even behind a flood of
  idle connections; with every one being answered, the newcomer is closed;
- a request head is at most ``HEAD_LIMIT`` bytes (431 beyond).

POSTs to the paths of ``[[webhooks]]`` are the one exception to "read-only":
their body (sized by ``Content-Length``, at most the webhook's limit, 413
beyond, unread) is read within the same connection lifetime and handed to
:class:`Webhooks` (bridge/webhooks.py decides what it starts).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST

from bridge.core.hostport import HostPort
from bridge.errors import StartupError

log = logging.getLogger(__name__)

Readiness = Callable[[], Awaitable[str | None]]
"""Returns None when ready, else the reason it is not."""

HEAD_LIMIT = 8192
"""Bytes of request line plus headers accepted; more is answered 431 and closed."""
TIMEOUT_S = 5.0
"""A connection's whole life: a client slower to send its head or to read the answer is cut off."""
MAX_CONNECTIONS = 64
"""Connections open at once; probes and a scraper need a handful."""
DISCARD_LIMIT = 1 << 20
"""Bytes a client may still send after its head (a body, pipelined requests) that are read and
dropped before closing: closing with unread data resets the connection, which can destroy the
answer before the client has read it."""

_REASONS = {
    200: "OK",
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}

Response = tuple[int, bytes, str]
"""(status, body, content type)"""


class Webhooks(Protocol):
    """What the listener needs of bridge/webhooks.py."""

    def body_limit(self, path: str) -> int | None:
        """The largest body taken at ``path``; None: no webhook there."""
        ...

    def too_large(self, path: str) -> Response: ...

    async def deliver(self, path: str, headers: Mapping[str, str], body: bytes) -> Response: ...


def _path(target: str) -> str:
    if not target.startswith("/"):
        # Absolute form (``http://host/healthz``, from proxies): the path follows the host.
        target = "/" + target.partition("://")[2].partition("/")[2]
    return target.partition("?")[0]


class _Endpoints:
    def __init__(self, readiness: Readiness, exposition: Callable[[], bytes]) -> None:
        self._readiness = readiness
        self._exposition = exposition

    async def answer(self, method: str, target: str) -> Response:
        path = _path(target)
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


_Head = tuple[str, str, dict[str, str]]
"""Method, target, headers (names in lower case; a repeated header: its values joined by ", ")."""


async def _read_head(reader: asyncio.StreamReader) -> _Head | int:
    """The request's method, target and headers, or the status to refuse it with.

    Lines may end in a bare LF as well as CRLF (RFC 9112 allows accepting both).
    """
    request_line = b""
    headers: dict[str, str] = {}
    size = 0
    try:
        while True:
            line = await reader.readuntil(b"\n")
            size += len(line)
            if size > HEAD_LIMIT:
                return 431
            if line in (b"\r\n", b"\n"):
                break
            if request_line:
                name, colon, value = line.decode("latin-1").partition(":")
                if colon:
                    # Joined as RFC 9110 (5.3) says, never one value picked: a proxy may read the
                    # first and we the last, so a repeated signature or Content-Length must fail.
                    key, value = name.strip().lower(), value.strip()
                    headers[key] = f"{headers[key]}, {value}" if key in headers else value
            request_line = request_line or line
    except asyncio.LimitOverrunError:  # one line longer than the reader's limit (HEAD_LIMIT)
        return 431
    parts = request_line.rstrip(b"\r\n").decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return 400
    return parts[0], parts[1], headers


def _encode(status: int, body: bytes, content_type: str, *, with_body: bool) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1")
    return head + body if with_body else head


class _Server:
    """The open connections of one listener, each served by a task of ``tasks``."""

    tasks: asyncio.TaskGroup | None = None
    """Where connection tasks run; set once the listener serves."""

    def __init__(
        self,
        endpoints: _Endpoints,
        *,
        timeout: float,
        max_connections: int,
        webhooks: Webhooks | None = None,
    ) -> None:
        self._endpoints = endpoints
        self._webhooks = webhooks
        self._timeout = timeout
        self._max = max_connections
        # Oldest first; True while its answer is being prepared or written.
        self._open: dict[asyncio.StreamWriter, bool] = {}
        self._closed = False

    def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The streams' connection callback: admit the connection or close it at once."""
        if not self._closed and len(self._open) >= self._max:
            idle = next((w for w, answering in self._open.items() if not answering), None)
            if idle is not None:
                # Its task then sees the end of the stream and ends.
                del self._open[idle]
                idle.transport.abort()
        if self.tasks is None or self._closed or len(self._open) >= self._max:
            writer.transport.abort()
            return
        # A zero high-water mark makes drain() wait until the whole answer is in the kernel's hands,
        # so the final abort() loses none of it.
        writer.transport.set_write_buffer_limits(high=0)
        self._open[writer] = False
        self.tasks.create_task(self._serve(reader, writer))

    def close(self) -> None:
        """Refuse connections from now on (the listener may still hand over accepted ones)."""
        self._closed = True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._exchange(reader, writer)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away, or was too slow
        except OSError as exc:
            # Gone before the answer's end: a load balancer's health check closes
            # its connection as soon as it has the status line (ENOTCONN).
            log.debug("http: the client went away: %s", exc)
        except Exception:
            # A bug in an endpoint costs that one answer, not the bridge.
            log.exception("http: answering a request failed")
        finally:
            self._open.pop(writer, None)
            writer.transport.abort()  # frees the socket now; the answer, if any, is out already

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_head(reader)
        if writer not in self._open:
            return  # closed to make room while its head was arriving
        self._open[writer] = True
        if isinstance(request, int):
            status, body, kind, method = request, b"", "text/plain", "GET"
        else:
            method, target, headers = request
            limit = None if self._webhooks is None else self._webhooks.body_limit(_path(target))
            if limit is not None:
                status, body, kind = await self._webhook(method, _path(target), headers, reader)
            else:
                status, body, kind = await self._endpoints.answer(method, target)
        writer.write(_encode(status, body, kind, with_body=method != "HEAD"))
        writer.write_eof()
        await writer.drain()
        self._open[writer] = False
        # Wait for the client to close, dropping what else it sends: see DISCARD_LIMIT.
        discarded = 0
        while discarded <= DISCARD_LIMIT and (data := await reader.read(65536)):
            discarded += len(data)

    async def _webhook(
        self, method: str, path: str, headers: dict[str, str], reader: asyncio.StreamReader
    ) -> Response:
        if self._webhooks is None or method != "POST":
            return 405, b"method not allowed\n", "text/plain"
        length = headers.get("content-length", "")
        if not length.isdigit():
            # Chunked bodies are not taken: every webhook sender sets Content-Length.
            return 411, b"Content-Length required\n", "text/plain"
        limit = self._webhooks.body_limit(path)
        if limit is None or int(length) > limit:
            return self._webhooks.too_large(path)
        body = await reader.readexactly(int(length))
        return await self._webhooks.deliver(path, headers, body)


async def serve_http(
    listen: HostPort,
    readiness: Readiness,
    exposition: Callable[[], bytes],
    bound: Callable[[int], None],
    *,
    connection_timeout: float = TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
    webhooks: Webhooks | None = None,
) -> None:
    """Serve until cancelled; calls ``bound`` with the port once it listens (port 0: any).

    A port that cannot be bound is a :class:`StartupError` naming ``http.listen``.
    """
    endpoints = _Endpoints(readiness, exposition)
    server = _Server(
        endpoints, timeout=connection_timeout, max_connections=max_connections, webhooks=webhooks
    )
    try:
        # Bound here, served below: the accept callback needs the task group.
        listener = await asyncio.start_server(
            server.accept, listen.host, listen.port, limit=HEAD_LIMIT, start_serving=False
        )
    except OSError as exc:
        raise StartupError(f"http.listen = {listen}: cannot listen: {_reason(exc)}") from None
    async with asyncio.TaskGroup() as tasks:
        server.tasks = tasks
        try:
            await listener.start_serving()
            bound(listener.sockets[0].getsockname()[1])
            await asyncio.Event().wait()  # until cancelled
        finally:
            listener.close()
            server.close()
            # The task group now cancels the connection tasks, each closing its socket. They are
            # this group's, not the streams' own: a cancelled streams callback task logs an error.


def _reason(exc: OSError) -> str:
    """The one line the operator sees after the setting and the address."""
    if isinstance(exc, socket.gaierror):
        return exc.strerror or str(exc)  # its errno is getaddrinfo's, unknown to os.strerror
    # asyncio words a bind error as "error while attempting to bind on address ...: ..."
    return os.strerror(exc.errno) if exc.errno else str(exc)

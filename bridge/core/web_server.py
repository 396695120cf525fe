"""Serve an aiohttp application on a listening socket, every client bounded in time and number.

On top of aiohttp's strict parsing: a head within ``head_timeout_s``, a body only through
:func:`read_body` (411 / 413 unread, 408 past ``body_timeout_s``), at most ``max_connections``
(one more closes the one opened longest ago whose handler is not running). A handler's
exception is logged and answered 500; malformed requests are logged at DEBUG only
(docs/operations.md, "The HTTP listeners").
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from bridge.core.http_limits import ClientLimits
from bridge.core.listen_socket import BACKLOG

log = logging.getLogger(__name__)


class _Quiet(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's log of a request it could not parse: a client's error, at DEBUG, one line."""

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        # Every level aiohttp picks (debug, error, exception) comes through here; exc_info is
        # dropped: the client's error, not a traceback of ours (a handler's failure is logged by
        # the middleware, with its traceback).
        super().log(logging.DEBUG, msg, *args)


@dataclass(slots=True)
class _Connection:
    transport: asyncio.Transport
    timer: asyncio.TimerHandle | None = None
    answering: bool = False
    """Its handler runs with the request (and body) fully read: not evicted for a newcomer."""
    body_deadline: float = 0.0


class _Connections:
    """The open connections of one listener, in the order they opened."""

    def __init__(self, limits: ClientLimits) -> None:
        self._limits = limits
        self._loop = asyncio.get_running_loop()
        self._open: dict[RequestHandler, _Connection] = {}

    def admit(self, handler: RequestHandler, transport: asyncio.Transport) -> bool:
        if len(self._open) >= self._limits.max_connections:
            # By opening order, never by activity: clients that keep their connections
            # busy would otherwise push a newcomer's to the front.
            idle = next((h for h, c in self._open.items() if not c.answering), None)
            if idle is None:
                return False
            self._end(idle)
        self._open[handler] = _Connection(transport)
        self._arm(handler, self._limits.head_timeout_s)
        return True

    def lost(self, handler: RequestHandler) -> None:
        connection = self._open.pop(handler, None)
        if connection is not None and connection.timer is not None:
            connection.timer.cancel()

    def close_all(self) -> None:
        for handler in list(self._open):
            self._end(handler)

    def request_started(self, handler: RequestHandler, has_body: bool) -> None:
        connection = self._open.get(handler)
        if connection is None:
            return
        connection.body_deadline = self._loop.time() + self._limits.body_timeout_s
        if has_body:
            self._arm(handler, self._limits.body_timeout_s)
        else:
            self._answering(connection)

    def body_deadline(self, handler: RequestHandler) -> float:
        connection = self._open.get(handler)
        return self._loop.time() if connection is None else connection.body_deadline

    def reading_body(self, handler: RequestHandler) -> None:
        """The handler reads the body under its own deadline (answered 408 past it)."""
        connection = self._open.get(handler)
        if connection is not None and connection.timer is not None:
            connection.timer.cancel()
            connection.timer = None

    def body_read(self, handler: RequestHandler) -> None:
        connection = self._open.get(handler)
        if connection is not None:
            self._answering(connection)

    def request_done(self, handler: RequestHandler) -> None:
        connection = self._open.get(handler)
        if connection is not None:
            connection.answering = False
            self._arm(handler, self._limits.head_timeout_s)

    def _answering(self, connection: _Connection) -> None:
        connection.answering = True
        if connection.timer is not None:
            connection.timer.cancel()
            connection.timer = None

    def _arm(self, handler: RequestHandler, delay: float) -> None:
        connection = self._open[handler]
        if connection.timer is not None:
            connection.timer.cancel()
        connection.timer = self._loop.call_later(delay, self._end, handler)

    def _end(self, handler: RequestHandler) -> None:
        connection = self._open.pop(handler, None)
        if connection is not None:
            if connection.timer is not None:
                connection.timer.cancel()
            # abort, not close: a client that does not read would hold a close forever.
            connection.transport.abort()


class _Tracked(asyncio.Protocol):
    """aiohttp's protocol for one connection, admitted and watched by :class:`_Connections`."""

    def __init__(self, handler: RequestHandler, connections: _Connections) -> None:
        self._handler = handler
        self._connections = connections
        self._admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # a TCP server's: always one
        if not self._connections.admit(self._handler, transport):
            transport.abort()
            return
        self._admitted = True
        self._handler.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._admitted:
            self._connections.lost(self._handler)
            self._handler.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        # A client may send its request and shut its side (half-close): its answer still goes
        # out, then the connection closes; an idle one ends at its head deadline.
        self._handler.close()
        return True

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()


_CONNECTIONS = web.AppKey("connections", _Connections)


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request's body, at most ``limit`` bytes, read by its connection's body deadline.

    Raises the answer to send instead: 411 without ``Content-Length``, 413 over
    ``limit`` (unread), 408 past the deadline (the connection is then closed).
    The application's ``client_max_size`` must be at least ``limit`` (aiohttp's own
    cap, 1 MiB unless set).
    """
    # config_dict: also from a sub-application mounted on the listener (the web console).
    connections = request.config_dict[_CONNECTIONS]
    handler = request.protocol
    length = request.content_length
    if length is None:
        raise web.HTTPLengthRequired(text="Content-Length required\n")
    if length > limit:
        raise web.HTTPRequestEntityTooLarge(limit, length, text="body too large\n")
    connections.reading_body(handler)
    try:
        async with asyncio.timeout_at(connections.body_deadline(handler)):
            body = await request.read()  # kept: request.text() and .json() read it again
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text="body not sent in time\n", headers={"Connection": "close"}
        ) from None
    connections.body_read(handler)
    return body


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _middleware(connections: _Connections) -> Any:
    @web.middleware
    async def bounded(request: web.Request, handler: Handler) -> web.StreamResponse:
        protocol = request.protocol
        connections.request_started(protocol, has_body=request.body_exists)
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except (ConnectionError, asyncio.IncompleteReadError):
            raise  # the client went away (or was cut off): nobody to answer
        except Exception:
            log.exception("http: answering %s %s failed", request.method, request.path)
            return web.Response(status=500, text="internal error\n")
        finally:
            connections.request_done(protocol)

    return bounded


@asynccontextmanager
async def listening(
    app: web.Application, sock: socket.socket, limits: ClientLimits
) -> AsyncIterator[None]:
    """Serve ``app`` on ``sock`` (a listening socket, bridge/core/listen_socket.py) in the block.

    Leaving the block closes the socket and every connection.
    """
    connections = _Connections(limits)
    app[_CONNECTIONS] = connections
    app.middlewares.append(_middleware(connections))
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        handler_cancellation=False,  # a delivery being recorded finishes even if its client left
        keepalive_timeout=limits.head_timeout_s,
        lingering_time=0,
        max_line_size=limits.max_head_line,
        max_field_size=limits.max_head_line,
        max_headers=limits.max_headers,
        shutdown_timeout=0.1,
        logger=_Quiet(logging.getLogger(f"{__name__}.client"), {}),
    )
    await runner.setup()
    try:
        server = runner.server
        if server is None:  # pragma: no cover - set by setup()
            raise RuntimeError("aiohttp runner not set up")
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(
            lambda: _Tracked(server(), connections), sock=sock, backlog=BACKLOG
        )
        try:
            yield
        finally:
            listener.close()
            connections.close_all()
            with suppress(Exception):
                await listener.wait_closed()
    finally:
        await runner.cleanup()

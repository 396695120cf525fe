"""The Events API endpoint: an aiohttp server handing requests to Bolt.

Bolt verifies signature and timestamp (401 otherwise) and answers ``url_verification``; a
200 comes only after the listener handed the message to the service (else 500, see
``settled``). Served by bridge/core/web_server.py with ``[http]``'s bounds; a body over
:data:`BODY_LIMIT` is refused unread; an address that cannot be bound is a
:class:`~.web.SettingRefused` naming ``slack.listen`` (docs/deployment.md, "Inside the Slack
transport").
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest

from bridge.core.hostport import HostPort
from bridge.core.http_limits import ClientLimits
from bridge.core.listen_socket import bind, port_of
from bridge.core.web_server import listening, read_body
from transports.slack.web import SettingRefused

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
BODY_LIMIT = 1 << 20
"""Bytes of an event's body: Slack's are a few kilobytes."""


DEFAULT_LIMITS = ClientLimits()

Settled = Callable[[AsyncBoltRequest, int], bool]


def events_application(app: AsyncApp, settled: Settled) -> web.Application:
    """An aiohttp application serving Bolt at :data:`EVENTS_PATH`."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await read_body(request, BODY_LIMIT)
        try:
            # Slack's bodies are UTF-8 whatever the header says; Bolt parses as it is built.
            headers: dict[str, str | Sequence[str]] = {
                name: request.headers.getall(name) for name in request.headers
            }
            bolt_request = AsyncBoltRequest(
                body=body.decode(), query=request.query_string, headers=headers
            )
        except ValueError:  # not UTF-8, or a form's payload that is not JSON: not from Slack
            return web.Response(status=400, text="not a Slack request\n")
        bolt_response = await app.async_dispatch(bolt_request)
        if bolt_response.status == 200 and not settled(bolt_request, 200):
            # A 200 for an event no listener handed over would be taken as
            # delivered; a 500 makes Slack send it again.
            log.warning("slack events: an event was not handed over; answering 500")
            return web.Response(status=500)
        response: web.StreamResponse = await to_aiohttp_response(bolt_response)
        return response

    web_app = web.Application(client_max_size=BODY_LIMIT)  # read_body's limit, and aiohttp's
    web_app.router.add_post(EVENTS_PATH, handle)
    return web_app


async def serve_events(
    app: AsyncApp,
    settled: Settled,
    listen: HostPort,
    on_listening: Callable[[int], None],
    limits: ClientLimits = DEFAULT_LIMITS,
) -> None:
    """Serve the endpoint on ``listen`` until cancelled; ``on_listening`` gets the bound port.

    ``settled`` decides whether Bolt's 200 for a request may stand. Raises
    :class:`~.web.SettingRefused` when ``listen`` cannot be bound.
    """
    async with AsyncExitStack() as stack:
        try:
            sock = bind(listen)
        except OSError as exc:
            # The one line the operator sees: the setting, the address, the reason.
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise SettingRefused(
                "slack", f"slack.listen = {listen}: cannot listen: {reason}"
            ) from None
        await stack.enter_async_context(listening(events_application(app, settled), sock, limits))
        bound = port_of(sock)
        log.info("slack events endpoint listening on %s:%s%s", listen.host, bound, EVENTS_PATH)
        on_listening(bound)
        await asyncio.Future()  # serve until cancelled

"""The Events API endpoint: an aiohttp server handing requests to Bolt.

Bolt verifies the signature and timestamp (``X-Slack-Signature``,
``X-Slack-Request-Timestamp``; stale or forged requests get 401), answers
``url_verification``, and, because the app processes before responding, only
returns 200 after the listener has handed the message to the service. A 200
from Bolt for an event no listener finished becomes a 500 (see ``settled``).

An address that cannot be bound (taken, not local, a privileged port) is a
:class:`~.web.SettingRefused` naming ``slack.listen``, like ``http.listen``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest

from bridge.core.hostport import HostPort
from transports.slack.web import SettingRefused

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"


Settled = Callable[[AsyncBoltRequest, int], bool]


def events_application(app: AsyncApp, settled: Settled) -> web.Application:
    """An aiohttp application serving Bolt at :data:`EVENTS_PATH`."""

    async def handle(request: web.Request) -> web.StreamResponse:
        bolt_request = await to_bolt_request(request)
        bolt_response = await app.async_dispatch(bolt_request)
        if bolt_response.status == 200 and not settled(bolt_request, 200):
            # A 200 for an event no listener handed over would be taken as
            # delivered; a 500 makes Slack send it again.
            log.warning("slack events: an event was not handed over; answering 500")
            return web.Response(status=500)
        response: web.StreamResponse = await to_aiohttp_response(bolt_response)
        return response

    web_app = web.Application()
    web_app.router.add_post(EVENTS_PATH, handle)
    return web_app


async def serve_events(
    app: AsyncApp,
    settled: Settled,
    listen: HostPort,
    on_listening: Callable[[int], None],
) -> None:
    """Serve the endpoint on ``listen`` until cancelled; ``on_listening`` gets the bound port.

    ``settled`` decides whether Bolt's 200 for a request may stand. Raises
    :class:`~.web.SettingRefused` when ``listen`` cannot be bound.
    """
    runner = web.AppRunner(events_application(app, settled), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, listen.host, listen.port)
        try:
            await site.start()
        except OSError as exc:
            # The one line the operator sees: the setting, the address, the reason.
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise SettingRefused(
                "slack", f"slack.listen = {listen}: cannot listen: {reason}"
            ) from None
        # With port 0 the OS picks one; the runner knows which.
        bound = runner.addresses[0][1] if runner.addresses else listen.port
        log.info("slack events endpoint listening on %s:%s%s", listen.host, bound, EVENTS_PATH)
        on_listening(int(bound))
        await asyncio.Future()  # serve until cancelled
    finally:
        await runner.cleanup()

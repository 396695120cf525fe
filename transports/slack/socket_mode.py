"""One Socket Mode connection, read by the transport's own loop.

It ends (returns or raises) when the connection ends; the transport's loop decides when to
open the next one, with backoff. Slack's documented frames: ``apps.connections.open`` gives
a ``wss`` URL; ``hello``, envelopes acknowledged by their ``envelope_id``, ``disconnect``
(docs/deployment.md, "Inside the Slack transport").
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from transports.slack.web import check_token

log = logging.getLogger(__name__)

EnvelopeHandler = Callable[[Mapping[str, Any]], Awaitable[bool]]
"""Handles one envelope; True means it is settled and may be acknowledged."""

HEARTBEAT_S = 30.0
"""Ping interval; a connection that stops answering is closed and replaced."""


class SocketModeError(Exception):
    """The Socket Mode connection ended without Slack asking for a reconnect."""


class SocketModeConnection:
    """Opens one Socket Mode WebSocket and serves envelopes until it ends."""

    def __init__(
        self,
        client: AsyncWebClient,
        app_token: str,
        handle: EnvelopeHandler,
        session: aiohttp.ClientSession,
    ) -> None:
        """``app_token`` is the app-level token (``xapp-``) that opens connections."""
        self._client = client
        self._app_token = app_token
        self._handle = handle
        self._session = session
        self.connected = False
        """True between ``hello`` and the end of the connection."""

    async def serve(self, on_hello: Callable[[], None]) -> None:
        """Connect and serve envelopes as they arrive, each acknowledged once settled.

        Envelopes are handled concurrently (at most :data:`IN_FLIGHT` at a
        time; the handler keeps their order where it matters). Returns when
        Slack sends ``disconnect`` asking for a fresh connection, once the
        envelopes under way are settled; raises :class:`SocketModeError` when
        the socket drops or Slack disabled Socket Mode (envelopes under way
        are cancelled: unacknowledged, Slack delivers them again),
        :class:`~.web.SettingRefused` when Slack refuses the app token, and
        other Web API errors when no URL can be had.
        """
        try:
            response = await self._client.apps_connections_open(app_token=self._app_token)
        except SlackApiError as exc:
            check_token(exc, "slack.app_token", "apps.connections.open")
            raise
        url = str(response["url"])
        try:
            async with self._session.ws_connect(url, heartbeat=HEARTBEAT_S) as ws:
                envelopes = _Envelopes(ws, self._handle)
                try:
                    async with asyncio.TaskGroup() as tasks:
                        async for frame in ws:
                            if frame.type is not aiohttp.WSMsgType.TEXT:
                                continue  # closing frames end the iteration
                            if not await self._frame(envelopes, tasks, frame.data, on_hello):
                                return
                        raise SocketModeError(f"socket closed (code {ws.close_code})")
                except ExceptionGroup as group:
                    # The loop's own error, or a handler's: callers expect it as itself.
                    raise group.exceptions[0] from None
        finally:
            self.connected = False

    async def _frame(
        self,
        envelopes: _Envelopes,
        tasks: asyncio.TaskGroup,
        data: str,
        on_hello: Callable[[], None],
    ) -> bool:
        """Handle one text frame; False once this connection should be given up."""
        try:
            frame = json.loads(data)
        except ValueError:
            log.warning("slack socket mode: ignoring a frame that is not JSON")
            return True
        if not isinstance(frame, dict):
            return True
        kind = frame.get("type")
        if kind == "hello":
            self.connected = True
            on_hello()
            return True
        if kind == "disconnect":
            reason = frame.get("reason", "")
            if reason == "link_disabled":
                raise SocketModeError("Socket Mode is disabled for this app (link_disabled)")
            log.info("slack socket mode: server asked to reconnect (%s)", reason)
            return False
        envelope_id = frame.get("envelope_id")
        if not isinstance(envelope_id, str):
            return True
        await envelopes.slot.acquire()
        tasks.create_task(envelopes.settle(frame, envelope_id), name=f"slack-envelope-{kind}")
        return True


IN_FLIGHT = 64
"""Envelopes handled at once at most; reading waits for a free place beyond that."""


class _Envelopes:
    """Handles envelopes of one connection concurrently; acknowledges each once settled."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, handle: EnvelopeHandler) -> None:
        self._ws = ws
        self._handle = handle
        self._sending = asyncio.Lock()
        self.slot = asyncio.Semaphore(IN_FLIGHT)

    async def settle(self, frame: Mapping[str, Any], envelope_id: str) -> None:
        try:
            if await self._handle(frame):
                # One frame at a time on the socket, whatever order envelopes settle in.
                async with self._sending:
                    await self._ws.send_str(json.dumps({"envelope_id": envelope_id}))
            else:
                # No ack: Slack delivers the envelope again, here or on the next connection.
                log.warning(
                    "slack socket mode: envelope %s not settled, left unacknowledged",
                    frame.get("type"),
                )
        finally:
            self.slot.release()

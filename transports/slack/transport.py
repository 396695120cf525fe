"""The Slack transport: a Bolt ``AsyncApp`` fed by Socket Mode or the Events API.

Inbound: every ``message`` / ``app_mention`` event passes through Bolt's
middleware (self-event filtering, request verification) into one listener,
which translates it (:mod:`.inbound`) and hands it to the service's sink.
The app processes before responding, so Slack's acknowledgement (socket ack
or HTTP 200) is sent only after the sink returned, that is, after the
message is durably recorded; if the sink fails, no acknowledgement is sent
and Slack delivers the event again. Redeliveries already handled are
recognised by (channel, ts) and acknowledged without a second hand-over.

Socket Mode envelopes are handled as they arrive, without waiting for the
ones before (a burst is recorded in one commit), yet handed to the sink in
their order (:mod:`.turns`).

Nothing on that path waits for more than it must: no lock is held while
the sink runs (the store's idempotent accept settles concurrent
redeliveries), display names are looked up within a short wait budget
shared by all events (:mod:`.names`: the sender's and mentioned users'),
and a ``429`` raises instead of sleeping. Shared files are only described
here; the service fetches them (:meth:`SlackTransport.fetch_attachment`)
when their run is prepared.

Outbound: :mod:`.outbound` over one Web API client that never sleeps on a 429.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError

from bridge.core import stages
from bridge.core.http_limits import Limits
from bridge.core.model import (
    Attachment,
    ExternalMessageId,
    InboundMessage,
    Reply,
    RoomId,
    RoomKey,
)
from bridge.core.transport import (
    ApprovalAction,
    Delivery,
    InboundSink,
    RoomBinding,
    RunPhase,
    SinkClosed,
    TransportError,
)
from transports.backoff import Backoff
from transports.base import Transport
from transports.slack.approvals import ACTION_PREFIX, to_action
from transports.slack.events_http import serve_events
from transports.slack.files import STUB_PREFIX, attachments, download, may_have_token
from transports.slack.inbound import (
    SLACK,
    RecentKeys,
    decoded,
    dedup_key,
    to_event,
    users_to_name,
)
from transports.slack.names import DisplayNames
from transports.slack.outbound import SlackOutbound
from transports.slack.settings import SlackSettings
from transports.slack.socket_mode import SocketModeConnection
from transports.slack.turns import Turns
from transports.slack.web import SettingRefused, check_token, error_code, web_client

log = logging.getLogger(__name__)

HEALTHY_AFTER_S = 30.0
"""A connection up this long counts as healthy: the next reconnect starts the backoff over."""

Sleep = Callable[[float], Awaitable[None]]


HANDED_OVER = "chatbridge_handed_over"
"""Set in a request's Bolt context once a listener has dealt with its event."""
TICKET = "chatbridge_ticket"
"""In a Socket Mode request's Bolt context: its envelope's place in the order (see .turns)."""


def settled(request: AsyncBoltRequest, status: int) -> bool:
    """Whether Slack may be told the request was handled (socket ack, HTTP 2xx).

    An event is settled only when one of the transport's listeners finished
    with it: whatever else Bolt answers, even a 200 (its authorization
    failing, a middleware cutting the chain short), means the event may not
    have been handed over, and Slack must deliver it again. Anything that is
    not an event (a slash command, an interaction: Slack never sends those
    again, and an approval click is acknowledged at once, see
    :meth:`SlackTransport._on_approval`) is settled unless Bolt failed (5xx).
    """
    if request.body.get("type") == "event_callback":
        return status == 200 and request.context.get(HANDED_OVER) is True
    return status < 500


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who the bridge is in the workspace (from ``auth.test``)."""

    user_id: str
    bot_id: str | None


class SlackTransport(Transport):
    """Serves the configured Slack channels and DMs."""

    name = SLACK

    def __init__(
        self,
        settings: SlackSettings,
        rooms: Sequence[RoomBinding],
        *,
        backoff: Backoff | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        http_limits: Limits | None = None,
    ) -> None:
        """``http_limits``: what each client of the events endpoint may take (``[http]``'s).

        ``backoff``, ``sleep`` and ``clock`` are for tests (reconnect delays).
        """
        self._settings = settings
        self._http_limits = http_limits or Limits()
        self._rooms: Mapping[RoomId, RoomBinding] = {r.room_id: r for r in rooms}
        self._room_ids = frozenset(self._rooms)
        self._backoff = backoff or Backoff(cap=settings.reconnect_max_s)
        self._sleep = sleep
        self._clock = clock
        self._up_since: float | None = None
        self._client = web_client(settings.bot_token.get_secret_value(), settings.api_url)
        self.names = DisplayNames(self._display_name)
        """Display names of mentioned users (cached ``users.info``)."""
        self._outbound = SlackOutbound(
            self._client,
            self._rooms,
            message_limit=settings.message_limit,
            upload_threshold=settings.upload_threshold,
        )
        self._recent = RecentKeys()
        self._socket: SocketModeConnection | None = None
        self._listening = False
        self.events_port: int | None = None
        """Events mode: the port the endpoint is bound to, once listening."""
        self.connections = 0
        """How many times a connection came up (a Socket Mode ``hello``, or the endpoint)."""
        self.reconnects = 0
        """Connections after the first (a metric)."""
        self._handing: set[asyncio.Task[None]] = set()
        """Approval actions on their way to the sink, after their acknowledgement."""

    @property
    def connected(self) -> bool:
        if self._settings.mode == "events":
            return self._listening
        return self._socket is not None and self._socket.connected

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        """Connect, set ``ready``, serve until cancelled; reconnect with backoff on errors.

        Raises :class:`~.web.SettingRefused` when Slack refuses a token or
        the events endpoint cannot listen: no retry can fix a setting, so a
        start-up fails at once naming it (and so does a later reconnect, as
        the Matrix transport does when its token is revoked).
        """
        try:
            await self._serve(sink, ready)
        finally:
            for task in self._handing:
                task.cancel()

    async def _serve(self, sink: InboundSink, ready: asyncio.Event) -> None:
        while True:
            try:
                await self._serve_once(sink, ready)
            except (asyncio.CancelledError, SettingRefused):
                raise
            except Exception as exc:
                # The message is the library's; tokens are never part of it.
                log.warning("slack connection failed: %s: %s", type(exc).__name__, exc)
            finally:
                self._socket = None
                self._listening = False
            if self._up_since is not None and self._clock() - self._up_since >= HEALTHY_AFTER_S:
                # Only a connection that held up resets the backoff: one that
                # drops right after hello must not be retried at full speed.
                self._backoff.reset()
            self._up_since = None
            delay = self._backoff.next_delay()
            log.info("slack reconnecting in %.1f s", delay)
            await self._sleep(delay)

    async def _serve_once(self, sink: InboundSink, ready: asyncio.Event) -> None:
        identity = await self._identify()
        app = self._bolt_app(identity, sink)

        def up() -> None:
            self.connections += 1
            self.reconnects = self.connections - 1
            log.info("slack connected (%s mode) as %s", self._settings.mode, identity.user_id)
            self._up_since = self._clock()
            ready.set()

        if self._settings.mode == "events":

            def listening(port: int) -> None:
                self.events_port = port
                self._listening = True
                up()

            await serve_events(app, settled, self._settings.listen, listening, self._http_limits)
            return

        turns = Turns()

        async def handle(envelope: Mapping[str, Any]) -> bool:
            return await self._dispatch_envelope(app, envelope, turns)

        async with aiohttp.ClientSession() as session:
            self._socket = SocketModeConnection(
                self._client, self._settings.app_token.get_secret_value(), handle, session
            )
            await self._socket.serve(up)

    async def _identify(self) -> BotIdentity:
        try:
            response = await self._client.auth_test()
        except SlackApiError as exc:
            check_token(exc, "slack.bot_token", "auth.test")
            raise
        bot_id = response.get("bot_id")
        return BotIdentity(str(response["user_id"]), str(bot_id) if bot_id else None)

    def _bolt_app(self, identity: BotIdentity, sink: InboundSink) -> AsyncApp:
        events = self._settings.mode == "events"
        token = self._settings.bot_token.get_secret_value()

        async def authorize(enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
            # The identity is known from this connection's auth.test. Without
            # this Bolt makes its own auth.test on the first event, and when
            # that fails (a 429) it answers 200: the event would be
            # acknowledged without ever reaching the listener.
            return AuthorizeResult(
                enterprise_id=enterprise_id,
                team_id=team_id,
                bot_user_id=identity.user_id,
                bot_id=identity.bot_id,
                bot_token=token,
            )

        app = AsyncApp(
            # A client without a token: with one, Bolt would use its own
            # single-team authorization (and its auth.test) instead of ours.
            client=web_client(None, self._settings.api_url),
            authorize=authorize,
            signing_secret=self._settings.signing_secret.get_secret_value() if events else None,
            request_verification_enabled=events,
            # Bolt's filter answers 200 for the bot's own events without a
            # listener; :func:`.inbound.to_event` drops them instead, so that
            # every event reaches a listener and "handed over" means what it says.
            ignoring_self_events_enabled=False,
            # Acknowledge only after the listener has handed the message over.
            process_before_response=True,
            logger=logging.getLogger("transports.slack.bolt"),
        )

        async def on_message(event: dict[str, Any], context: AsyncBoltContext) -> None:
            await self._deliver(event, identity, sink, context.get(TICKET))
            context[HANDED_OVER] = True

        async def on_other_event(context: AsyncBoltContext) -> None:
            """Acknowledge events the bridge does not use, so Slack does not retry them."""
            context[HANDED_OVER] = True

        async def on_approval(ack: Callable[[], Awaitable[None]], body: dict[str, Any]) -> None:
            await ack()
            action = to_action(body, identity.user_id, self._room_ids)
            if action is not None:
                self._on_approval(action, sink)

        app.event("message")(on_message)
        app.event("app_mention")(on_message)
        app.event(re.compile(".*"))(on_other_event)
        app.action(re.compile(f"^{re.escape(ACTION_PREFIX)}"))(on_approval)
        return app

    def _on_approval(self, action: ApprovalAction, sink: InboundSink) -> None:
        """Hand an approval click to the sink after its acknowledgement, not before.

        Slack wants an interaction acknowledged within 3 seconds and never
        sends one again, so holding the acknowledgement until the sink has
        recorded the click gains nothing (a lost click shows the person an
        error they can only answer by clicking again) and risks the timeout.
        """
        task = asyncio.create_task(self._hand_over_action(action, sink), name="slack-approval")
        self._handing.add(task)
        task.add_done_callback(self._handing.discard)

    async def _hand_over_action(self, action: ApprovalAction, sink: InboundSink) -> None:
        try:
            await sink(action)
        except SinkClosed:
            log.info("slack: an approval click came while shutting down; not taken")
        except Exception:
            # Nothing sends the click again: say so, the person can click again.
            log.exception(
                "slack: the approval click of %s on %s was lost", action.sender, action.message_id
            )

    async def _deliver(
        self,
        event: Mapping[str, Any],
        identity: BotIdentity,
        sink: InboundSink,
        ticket: tuple[Turns, int] | None,
    ) -> None:
        """Hand ``event`` over; with a ``ticket`` (Socket Mode), in the envelopes' order."""
        stages.stamp("received")
        parsed = to_event(event, identity.user_id, identity.bot_id, self._room_ids)
        if parsed is None:
            return
        key = dedup_key(event)
        if key in self._recent:
            log.debug("slack redelivered %s in %s; already handed over", key[1], key[0])
            return
        wanted = users_to_name(parsed)
        names = await self.names.resolve(wanted) if wanted else {}
        if ticket is not None:
            turns, number = ticket
            if isinstance(parsed, InboundMessage):
                await turns.message(number)
            else:
                await turns.change(number)
            # The sink records a message before its first wait: the next
            # envelope's message, let go now, reaches the store after this one.
            turns.handed(number)
        # No lock around the sink: it may take a while (the store, a command's
        # answer), and events of other channels must not wait behind it.
        await sink(decoded(parsed, names))
        self._recent.add(key)

    async def fetch_attachment(self, attachment: Attachment, dest: Path, limit_bytes: int) -> None:
        """Download a shared file with the bot's token (only from Slack's hosts, see .files)."""
        if attachment.ref.startswith(STUB_PREFIX):
            attachment = await self._file_info(attachment)
        if not may_have_token(attachment.ref, self._settings.api_url):
            raise TransportError(SLACK, "the file is not on a Slack host")
        token = self._settings.bot_token.get_secret_value()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(sock_read=30)) as session:
            await download(session, token, attachment, dest, limit_bytes)

    async def _file_info(self, stub: Attachment) -> Attachment:
        """The attachment a file stub stands for, with its URL (``files.info``)."""
        try:
            response = await self._client.files_info(file=stub.ref.removeprefix(STUB_PREFIX))
        except SlackApiError as exc:
            raise TransportError(SLACK, f"files.info failed: {error_code(exc)}") from exc
        found = attachments({"files": [response.get("file")]})
        if not found or found[0].ref.startswith(STUB_PREFIX):
            raise TransportError(SLACK, "files.info gave no download URL")
        return found[0]

    async def _display_name(self, user: str) -> str | None:
        response = await self._client.users_info(user=user)
        info = response.get("user") or {}
        profile = info.get("profile") or {}
        for name in (profile.get("display_name"), profile.get("real_name"), info.get("name")):
            if isinstance(name, str) and name:
                return name
        return None

    async def _dispatch_envelope(
        self, app: AsyncApp, envelope: Mapping[str, Any], turns: Turns
    ) -> bool:
        """Handle one envelope; called as envelopes arrive, before the previous are done."""
        number = turns.take()  # before any wait: tickets follow the envelopes' order
        try:
            payload = envelope.get("payload")
            if not isinstance(payload, dict):
                return True  # nothing to process; acknowledge so it is not resent
            headers: dict[str, str | Sequence[str]] = {}
            if envelope.get("retry_attempt"):
                headers["x-slack-retry-num"] = [str(envelope["retry_attempt"])]
                headers["x-slack-retry-reason"] = [str(envelope.get("retry_reason", ""))]
            request = AsyncBoltRequest(
                mode="socket_mode",
                body=payload,
                headers=headers,
                context={TICKET: (turns, number)},
            )
            response = await app.async_dispatch(request)
            return settled(request, int(response.status))
        finally:
            turns.finish(number)

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        """Post ``reply`` (split, or uploaded when long); returns the last message's ts."""
        return await self._outbound.send(reply, delivery)

    async def send_file(self, reply: Reply, key: str) -> ExternalMessageId | None:
        return await self._outbound.send_file(reply, key)

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        await self._outbound.edit(room, message_id, text)

    async def post_approval(self, request: Reply, ref: str) -> ExternalMessageId | None:
        """Post the request with Allow once · Allow for this session · Deny buttons."""
        return await self._outbound.post_approval(request, ref)

    async def close_approval(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Replace the request by its outcome, without buttons."""
        await self._outbound.close_approval(room, message_id, text)

    async def set_typing(self, room: RoomKey, typing: bool) -> None:
        """Slack has no typing indicator for bots; the ``running`` reaction shows activity."""

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        await self._outbound.set_phase(room, message_ids, phase)

"""The Slack transport: a Bolt ``AsyncApp`` fed by Socket Mode or the Events API.

Every ``message`` / ``app_mention`` event is translated (:mod:`.inbound`) and handed to the
service's sink in order (:mod:`.turns`), and acknowledged only once it is recorded; what
was posted while no connection was open is caught up first (:mod:`.catch_up`). Nothing on
that path sleeps or holds a lock. Outbound: :mod:`.outbound` (docs/deployment.md, "Slack
app" and "Inside the Slack transport").
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError

from bridge.core import stages
from bridge.core.http_limits import ClientLimits
from bridge.core.model import InboundMessage, Reply, RoomId, RoomKey
from bridge.core.transport import (
    ApprovalAction,
    InboundSink,
    RoomBinding,
    SeenMarks,
    SinkClosed,
    Transport,
    TransportError,
)
from transports.backoff import Backoff, retry
from transports.slack.approvals import ACTION_PREFIX, PICK_PREFIX, to_action
from transports.slack.catch_up import History, Missed, Unreadable, later, ts_of
from transports.slack.events_http import serve_events
from transports.slack.inbound import (
    SLACK,
    RecentKeys,
    decoded,
    dedup_key,
    to_event,
    users_to_name,
)
from transports.slack.marks import MarkSaver
from transports.slack.names import DisplayNames
from transports.slack.outbound import SlackOutbound
from transports.slack.settings import SlackSettings
from transports.slack.socket_mode import SocketModeConnection
from transports.slack.turns import Turns
from transports.slack.web import SettingRefused, check_token, web_client

log = logging.getLogger(__name__)

HEALTHY_AFTER_S = 30.0
"""A connection up this long counts as healthy: the next reconnect starts the backoff over."""

Sleep = Callable[[float], Awaitable[None]]


CATCH_UP_HOLD_S = 2.0
"""Live events wait at most this long for the catch-up of their connection: long
enough to keep a room's order after a short outage, short enough that Slack's
3-second acknowledgement window is kept when reading history takes longer."""

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


@dataclass(slots=True)
class _CatchUp:
    """One connection's catch-up, across its attempts."""

    pending: set[RoomId]
    """Channels not done yet."""
    cutoff: str
    """Nothing older is read (the ts of the maximum age, from the start)."""
    marks: dict[str, dict[str, str]] | None = None
    """Seen marks by channel and thread ("" the channel's own), as read at the start."""


class SlackTransport(Transport):
    """Serves the configured Slack channels and DMs."""

    name = SLACK
    outbound: SlackOutbound

    def __init__(
        self,
        settings: SlackSettings,
        rooms: Sequence[RoomBinding],
        *,
        marks: SeenMarks | None = None,
        backoff: Backoff | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        http_limits: ClientLimits | None = None,
    ) -> None:
        """``marks``: where the newest message seen per channel and thread is kept;
        without it nothing is caught up. ``http_limits``: what each client of the events
        endpoint may take (``[http]``'s). ``backoff``, ``sleep``, ``clock`` (reconnect
        delays) and ``wall`` (the catch-up's maximum age) are for tests."""
        self._settings = settings
        self._http_limits = http_limits or ClientLimits()
        self._rooms: Mapping[RoomId, RoomBinding] = {r.room_id: r for r in rooms}
        self._room_ids = frozenset(self._rooms)
        self._backoff = backoff or Backoff(cap=settings.reconnect_max_s)
        self._sleep = sleep
        self._clock = clock
        self._wall = wall
        self._marks = marks
        self._saver = MarkSaver(marks, wall) if marks is not None else None
        self.caught_up = asyncio.Event()
        """Clear while a connection's catch-up is under way (and live events wait for it)."""
        self.caught_up.set()
        self.caught_up_events = 0
        """Messages read from history and handed over (for tests and the log)."""
        self._up_since: float | None = None
        self._client = web_client(settings.bot_token.get_secret_value(), settings.api_url)
        self.names = DisplayNames(self._display_name)
        """Display names of mentioned users (cached ``users.info``)."""
        self.outbound = SlackOutbound(self._client, self._rooms, settings)
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
        saver = None
        if self._saver is not None:
            saver = asyncio.create_task(self._saver.run(), name="slack-seen-marks")
        try:
            await self._serve(sink, ready)
        finally:
            for task in self._handing:
                task.cancel()
            if saver is not None:
                saver.cancel()
                await asyncio.wait([saver])

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
        catching_up: list[asyncio.Task[None]] = []

        def up() -> None:
            self.connections += 1
            self.reconnects = self.connections - 1
            log.info("slack connected (%s mode) as %s", self._settings.mode, identity.user_id)
            self._up_since = self._clock()
            if self._marks is not None and self._settings.catch_up_max_age_s > 0:
                self.caught_up.clear()
                if self._saver is not None:
                    # Until a channel is caught up, no mark of it may pass what it missed.
                    self._saver.hold(self._room_ids)
                catch_up = self._catch_up(self._marks, identity, sink)
                catching_up.append(asyncio.create_task(catch_up, name="slack-catch-up"))
            ready.set()

        try:
            await self._connect(app, up)
        finally:
            for task in catching_up:
                task.cancel()
            if catching_up:
                await asyncio.wait(catching_up)
            self.caught_up.set()

    async def _connect(self, app: AsyncApp, up: Callable[[], None]) -> None:
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

        async def on_pick(ack: Callable[[], Awaitable[None]]) -> None:
            await ack()

        app.event("message")(on_message)
        app.event("app_mention")(on_message)
        app.event(re.compile(".*"))(on_other_event)
        app.action(re.compile(f"^{re.escape(ACTION_PREFIX)}"))(on_approval)
        # Picking a question's option answers nothing yet (its "Answer" button does):
        # acknowledged, so Slack shows the person no error.
        app.action(re.compile(f"^{re.escape(PICK_PREFIX)}"))(on_pick)
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

    async def _catch_up(self, marks: SeenMarks, identity: BotIdentity, sink: InboundSink) -> None:
        """Hand over what every served channel got since its mark (see :mod:`.catch_up`).

        Retried with backoff (at least as long as a ``ratelimited`` answer asks)
        until every channel is done; a channel done is not read again, and the
        others are read from the marks as they were at the start (live events
        let through meanwhile move them). Live events wait for it at most
        :data:`CATCH_UP_HOLD_S`.
        """
        work = _CatchUp(
            set(self._room_ids), ts_of(self._wall() - self._settings.catch_up_max_age_s)
        )
        try:
            await retry(
                lambda: self._catch_up_once(marks, work, identity, sink),
                what="slack catch-up",
                backoff=Backoff(cap=self._settings.reconnect_max_s),
                fatal=(SinkClosed,),
                sleep=self._sleep,
            )
        except SinkClosed:
            log.info("slack catch-up: shutting down; the next start reads the rest")
        finally:
            if self._saver is not None:
                self._saver.forget_held()
            self.caught_up.set()

    async def _catch_up_once(
        self, store: SeenMarks, work: _CatchUp, identity: BotIdentity, sink: InboundSink
    ) -> None:
        if work.marks is None:
            marks: dict[str, dict[str, str]] = {}
            for room, last in (await store.seen_marks(SLACK)).items():
                marks.setdefault(room.room_id, {})[room.thread] = last
            work.marks = marks
        marks, cutoff, pending = work.marks, work.cutoff, work.pending
        history = History(self._client, self._sleep)
        for channel in sorted(pending):
            try:
                missed = await history.missed(
                    channel, marks.get(channel, {}), cutoff, identity.user_id
                )
            except Unreadable as exc:
                log.warning("slack catch-up: cannot read %s (%s); skipped", channel, exc)
                pending.discard(channel)
                if self._saver is not None:
                    self._saver.release(channel)
                continue
            await self._hand_over_missed(channel, missed, identity, sink)
            # Nothing before the cutoff is read again (the skipped ones are told once).
            if self._saver is not None:
                self._saver.note(
                    RoomKey(SLACK, RoomId(channel)), later(missed.newest or cutoff, cutoff)
                )
                self._saver.release(channel)
            pending.discard(channel)

    async def _hand_over_missed(
        self, channel: str, missed: Missed, identity: BotIdentity, sink: InboundSink
    ) -> None:
        log.info(
            "slack catch-up: %d message(s) of %s since chatbridge last saw it, %d skipped",
            len(missed.events),
            channel,
            missed.skipped,
        )
        for event in missed.events:
            if await self._deliver(event, identity, sink, None, live=False):
                self.caught_up_events += 1
        if missed.skipped:
            hours = self._settings.catch_up_max_age_s / 3600
            notice = Reply(
                RoomKey(SLACK, RoomId(channel)),
                f"{missed.skipped} message(s) sent here while chatbridge was away are older"
                f" than {hours:g} h and were not run (`slack.catch_up_max_age_s`);"
                " send them again if they are still wanted.",
            )
            try:
                await self.outbound.send(notice)
            except TransportError as exc:
                # A notice: not worth reading the history again for.
                log.warning("slack catch-up: could not tell %s what was skipped: %s", channel, exc)

    async def _deliver(
        self,
        event: Mapping[str, Any],
        identity: BotIdentity,
        sink: InboundSink,
        ticket: tuple[Turns, int] | None,
        *,
        live: bool = True,
    ) -> bool:
        """Hand ``event`` over; with a ``ticket`` (Socket Mode), in the envelopes' order.

        True if a message or change went to the sink. A live event waits (at
        most :data:`CATCH_UP_HOLD_S`) for the connection's catch-up, so what
        was missed goes first.
        """
        stages.stamp("received")
        parsed = to_event(event, identity.user_id, identity.bot_id, self._room_ids)
        if parsed is None:
            return False
        key = dedup_key(event)
        if key in self._recent:
            log.debug("slack redelivered %s in %s; already handed over", key[1], key[0])
            return False
        if live and not self.caught_up.is_set():
            try:
                async with asyncio.timeout(CATCH_UP_HOLD_S):
                    await self.caught_up.wait()
            except TimeoutError:
                # A long catch-up (rate limits): live events stop waiting for it.
                self.caught_up.set()
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
        if self._saver is not None and isinstance(parsed, InboundMessage):
            # A reply marks its thread only: the channel's mark is where its own
            # timeline was read up to (a reply may be seen before an earlier post).
            if parsed.thread and parsed.thread != parsed.external_id:
                self._saver.note(
                    RoomKey(SLACK, parsed.room.room_id, parsed.thread), parsed.external_id
                )
            else:
                self._saver.note(parsed.room, parsed.external_id)
        return True

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

"""The Matrix transport: a sync loop of our own around matrix-nio's client.

nio's ``sync_forever`` saves the sync token *before* the events are handled
and has swallowed cancellation in the past, so this module owns the loop:

1. ``sync`` from the persisted position (nio decrypts what it can);
2. keep the encryption keys in shape (upload, query, claim, to-device);
3. accept invites to configured rooms;
4. hand every new message of a configured room to the sink, in order;
5. only then persist the new position.

A failure anywhere (a raised error or an error response) backs off with
jitter and retries from the last persisted position, so a crash or a lost
server replays rather than loses; the service drops the duplicates. On the
very first start (no position yet) the initial sync only sets the position:
history from before the bridge existed is not served.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any
from uuid import uuid4

from nio import (
    AsyncClient,
    AsyncClientConfig,
    ErrorResponse,
    JoinError,
    MegolmEvent,
    MessageDirection,
    RoomSendResponse,
    SyncResponse,
    WhoamiResponse,
)
from nio.exceptions import LocalProtocolError, OlmTrustError

from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomId, RoomKey, TransportName
from bridge.core.transport import Delivery, InboundSink, RoomBinding, SinkClosed, TransportError
from transports.backoff import Backoff
from transports.base import Transport
from transports.matrix.events import TRANSPORT, BotIdentity, is_own_join, to_inbound
from transports.matrix.render import MarkdownRenderer
from transports.matrix.settings import MatrixSettings
from transports.matrix.state import SavedSession, SessionFile, SyncPosition
from transports.text import split_markdown

log = logging.getLogger(__name__)

_SYNC_FILTER: dict[str, Any] = {
    # Presence, typing and receipts are noise to the bridge; room state is
    # kept because nio needs the members to encrypt.
    "presence": {"not_types": ["*"]},
    "account_data": {"not_types": ["*"]},
    "room": {
        "timeline": {"limit": 50},
        "ephemeral": {"not_types": ["*"]},
        "account_data": {"not_types": ["*"]},
    },
}
_MAX_EVENT_BYTES = 60_000
"""Synapse rejects events over 65 536 bytes; leave room for the envelope."""
_BACKFILL_PAGE = 100
_BACKFILL_MAX_EVENTS = 2_000
_AUTH_ERRORS = frozenset({"M_UNKNOWN_TOKEN", "M_MISSING_TOKEN", "M_USER_DEACTIVATED"})
"""The credentials are gone: no request can succeed, so retrying is pointless."""
_REFUSED = _AUTH_ERRORS | {"M_FORBIDDEN"}
"""For a login or one send: this request will never be allowed."""


class _Retryable(Exception):
    """An error response worth retrying; carries the response for the log."""

    def __init__(self, what: str, response: ErrorResponse) -> None:
        super().__init__(f"{what}: {response}")


def _check(what: str, response: object, permanent: frozenset[str] = _AUTH_ERRORS) -> None:
    """Turn an error object into an exception: ``permanent`` codes end the transport."""
    if isinstance(response, ErrorResponse):
        if response.status_code in permanent:
            raise TransportError("matrix", f"{what} refused: {response.status_code}")
        raise _Retryable(what, response)


class MatrixTransport(Transport):
    """Serves the configured Matrix rooms through one bot account.

    ``backoff`` paces reconnects (tests pass a fast one); ``typing_refresh_s``
    is how often an active typing notice is renewed before it expires.
    """

    name = TransportName("matrix")

    def __init__(
        self,
        settings: MatrixSettings,
        rooms: Sequence[RoomBinding],
        *,
        backoff: Backoff | None = None,
        typing_refresh_s: float = 20.0,
        send_attempts: int = 4,
    ) -> None:
        self._settings = settings
        self._rooms = {binding.room_id: binding for binding in rooms}
        self._backoff = backoff or Backoff()
        self._typing_refresh_s = typing_refresh_s
        self._send_attempts = send_attempts
        self._bot = BotIdentity(
            user_id=settings.user_id,
            ignore_other_bots=settings.ignore_other_bots,
            ignore_users=frozenset(settings.ignore_users),
        )
        self._position = SyncPosition(settings.store_path)
        self._session_file = SessionFile(settings.store_path)
        self._renderer = MarkdownRenderer()
        self._client: AsyncClient | None = None
        self._connected = False
        self._lost_connection = False
        self.reconnects = 0
        self._typing: set[RoomId] = set()
        self._synced = asyncio.Event()
        """Set (and replaced) after every sync the loop completes."""

    @property
    def connected(self) -> bool:
        """True after a successful sync, until the next failed one."""
        return self._connected

    # -- the loop ---------------------------------------------------------

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        """Log in, then sync until cancelled; ``ready`` is set after the first sync.

        Returns (without moving the sync position) when the sink raises
        :class:`SinkClosed`; raises :class:`TransportError` when the server
        refuses the credentials, which no retry can fix.
        """
        store = self._settings.store_path
        store.mkdir(parents=True, exist_ok=True, mode=0o700)
        client = AsyncClient(
            self._settings.homeserver,
            self._settings.user_id,
            store_path=str(store),
            config=AsyncClientConfig(
                # Surface connection errors and repeated rate limits to our
                # loop instead of nio retrying them forever out of sight.
                max_timeouts=0,
                max_limit_exceeded=3,
                encryption_enabled=True,
                store_sync_tokens=False,
                request_timeout=30,
            ),
        )
        try:
            await self._login_with_retry(client)
            self._client = client
            try:
                async with asyncio.TaskGroup() as tasks:
                    typing = tasks.create_task(self._keep_typing(client), name="matrix-typing")
                    try:
                        await self._sync_forever(client, sink, ready)
                    finally:
                        # The sync loop may also end by returning (SinkClosed): the
                        # helper must not keep the group, and so run(), open.
                        typing.cancel()
            except ExceptionGroup as group:
                # The typing helper never fails: the group only wraps the sync
                # loop's own error, which callers expect as itself.
                raise group.exceptions[0] from None
        finally:
            self._connected = False
            self._client = None
            await client.close()

    async def _sync_forever(
        self, client: AsyncClient, sink: InboundSink, ready: asyncio.Event
    ) -> None:
        token = self._position.load()
        first_start = token is None
        # nio keeps room state (members, encryption) only in memory: rebuild
        # it once with a full-state sync when resuming from a saved position.
        full_state = not first_start
        while True:
            try:
                response = await self._sync_once(client, token, full_state)
                await self._maintain_keys(client)
                await self._accept_invites(client, response)
                if first_start:
                    self._warn_unjoined(client)
                else:
                    await self._deliver(client, response, token, sink)
            except SinkClosed:
                # The service is shutting down: leave the position where it is,
                # so the next start delivers what this one could not.
                log.info("matrix: the service stopped accepting; leaving the sync loop")
                return
            except TransportError:
                raise
            except Exception as exc:  # CancelledError is no Exception: it propagates
                if self._connected:
                    self._lost_connection = True
                self._connected = False
                delay = self._backoff.next_delay()
                log.warning(
                    "matrix sync failed (%s: %s); retry %d in %.1fs",
                    type(exc).__name__,
                    exc,
                    self._backoff.failures,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            # Everything in this response was accepted: only now move the position.
            self._position.save(response.next_batch)
            token, first_start, full_state = response.next_batch, False, False
            if not self._connected:
                log.info("matrix connected as %s (device %s)", client.user_id, client.device_id)
                if self._lost_connection:
                    self.reconnects += 1
                    self._lost_connection = False
            self._connected = True
            self._backoff.reset()
            ready.set()
            synced, self._synced = self._synced, asyncio.Event()
            synced.set()

    async def _sync_once(self, client: AsyncClient, token: str | None, full: bool) -> SyncResponse:
        # nio ignores a response whose next_batch equals the one it saw last;
        # a sync retried from an older position must be processed again.
        client.next_batch = token or ""
        response = await client.sync(
            # Long-poll only once connected: the first sync should answer at once.
            timeout=self._settings.sync_timeout_ms if self._connected else 0,
            sync_filter=_SYNC_FILTER,
            since=token,
            full_state=full or None,
        )
        _check("sync", response)
        return response

    async def _maintain_keys(self, client: AsyncClient) -> None:
        """What nio's own loop does between syncs to keep encryption working."""
        if client.olm is None:
            return
        if client.should_upload_keys:
            _check("keys upload", await client.keys_upload())
        if client.should_query_keys:
            _check("keys query", await client.keys_query())
        if client.should_claim_keys:
            _check("keys claim", await client.keys_claim(client.get_users_for_key_claiming()))
        for response in await client.send_to_device_messages():
            _check("to-device", response)

    async def _accept_invites(self, client: AsyncClient, response: SyncResponse) -> None:
        for room_id in response.rooms.invite:
            if self._settings.auto_join == "configured" and room_id in self._rooms:
                joined = await client.join(room_id)
                if isinstance(joined, JoinError):
                    log.warning("matrix: could not join %s: %s", room_id, joined)
                else:
                    log.info("matrix: joined configured room %s", room_id)
            else:
                log.info("matrix: ignoring invite to unconfigured room %s", room_id)

    def _warn_unjoined(self, client: AsyncClient) -> None:
        for room_id in self._rooms:
            if room_id not in client.rooms and room_id not in client.invited_rooms:
                log.warning("matrix: not a member of configured room %s; invite the bot", room_id)

    async def _deliver(
        self, client: AsyncClient, response: SyncResponse, since: str | None, sink: InboundSink
    ) -> None:
        for room_id, info in response.rooms.join.items():
            if room_id not in self._rooms:
                continue
            events = list(info.timeline.events)
            if info.timeline.limited and since:
                # More arrived while we were away than one sync carries.
                events = await self._backfill(client, room_id, info.timeline.prev_batch, since)
                events += info.timeline.events
            start = 0
            for index, event in enumerate(events):
                if is_own_join(event, self._bot.user_id):
                    start = index + 1  # before our join is history we never saw
            for event in events[start:]:
                if isinstance(event, MegolmEvent):
                    log.warning(
                        "matrix: cannot decrypt %s in %s (no room key)", event.event_id, room_id
                    )
                    continue
                message = to_inbound(event, room_id, self._bot)
                if message is not None:
                    await sink(message)

    async def _backfill(
        self, client: AsyncClient, room_id: str, prev_batch: str | None, since: str
    ) -> list[Any]:
        """Events between ``since`` and a limited timeline's start, oldest first."""
        older: list[Any] = []
        cursor = prev_batch
        while cursor and len(older) < _BACKFILL_MAX_EVENTS:
            page = await client.room_messages(
                room_id,
                start=cursor,
                end=since,
                direction=MessageDirection.back,
                limit=_BACKFILL_PAGE,
            )
            if getattr(page, "status_code", None) == "M_FORBIDDEN":
                # History we may not see (visibility rules): serve what we have.
                log.warning("matrix: cannot backfill %s: %s", room_id, page)
                break
            _check("backfill", page)
            if not page.chunk:
                break
            older.extend(page.chunk)
            cursor = page.end
        older.reverse()
        return older

    # -- login --------------------------------------------------------------

    async def _login_with_retry(self, client: AsyncClient) -> None:
        while True:
            try:
                await self._login(client)
            except TransportError:
                raise
            except Exception as exc:
                delay = self._backoff.next_delay()
                log.warning(
                    "matrix login failed (%s: %s); retrying in %.1fs",
                    type(exc).__name__,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
            else:
                self._backoff.reset()
                return

    async def _login(self, client: AsyncClient) -> None:
        settings = self._settings
        token = settings.access_token.get_secret_value()
        if token:
            who = await self._whoami(client, token)
            if who is None:
                raise TransportError("matrix", "the access token was refused")
            client.restore_login(who.user_id, who.device_id, token)
            return
        saved = self._session_file.load(settings.user_id)
        if saved is not None:
            if await self._whoami(client, saved.access_token) is not None:
                client.restore_login(saved.user_id, saved.device_id, saved.access_token)
                return
            log.warning("matrix: the saved session was refused; logging in with a new device")
            self._session_file.forget()
        response = await client.login(
            settings.password.get_secret_value(), device_name=settings.device_name
        )
        _check("login", response, _REFUSED)
        self._session_file.save(
            SavedSession(response.user_id, response.device_id, response.access_token)
        )

    async def _whoami(self, client: AsyncClient, token: str) -> WhoamiResponse | None:
        """Who ``token`` belongs to; None if the server refuses it."""
        client.access_token = token
        response = await client.whoami()
        if isinstance(response, ErrorResponse):
            client.access_token = ""
            if response.status_code in _REFUSED:
                return None
            raise _Retryable("whoami", response)
        if response.user_id != self._settings.user_id:
            raise TransportError(
                "matrix", f"the token belongs to {response.user_id}, not {self._settings.user_id}"
            )
        return response

    # -- output -------------------------------------------------------------

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        """Post ``reply`` as one or more events; returns the last event's id.

        Results are ``m.text``; notices and progress are ``m.notice``. The
        first event answers ``in_reply_to``; a thread keeps every event in it.
        """
        room_id = self._room_id(reply.room)
        msgtype = "m.text" if reply.kind is ReplyKind.RESULT else "m.notice"
        last: ExternalMessageId | None = None
        for index, chunk in enumerate(self._chunks(reply.text, msgtype)):
            content = self._content(msgtype, chunk)
            reply_to = reply.in_reply_to if index == 0 else None
            if reply.thread:
                content["m.relates_to"] = {
                    "rel_type": "m.thread",
                    "event_id": reply.thread,
                    "is_falling_back": reply_to is None,
                    "m.in_reply_to": {"event_id": reply_to or reply.thread},
                }
            elif reply_to:
                content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
            last = await self._room_send(room_id, content)
        return last

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Replace a notice the bridge sent (live progress); long text is cut to one event."""
        room_id = self._room_id(room)
        chunks = self._chunks(text, "m.notice") or [""]
        new_content = self._content("m.notice", chunks[0])
        content = {
            "msgtype": "m.notice",
            "body": f"* {chunks[0]}",
            "m.new_content": new_content,
            "m.relates_to": {"rel_type": "m.replace", "event_id": message_id},
        }
        await self._room_send(room_id, content)

    async def set_typing(self, room: RoomKey, typing: bool) -> None:
        """Show the bot typing while a run is active; renewed until cleared."""
        room_id = self._room_id(room)
        if typing:
            self._typing.add(room_id)
        else:
            self._typing.discard(room_id)
        client = self._client
        if client is not None:
            await self._send_typing(client, room_id, typing)

    async def _keep_typing(self, client: AsyncClient) -> None:
        # Typing notices expire on the server; renew the active ones.
        while True:
            await asyncio.sleep(self._typing_refresh_s)
            for room_id in list(self._typing):
                await self._send_typing(client, room_id, True)

    async def _send_typing(self, client: AsyncClient, room_id: RoomId, typing: bool) -> None:
        timeout_ms = int(self._typing_refresh_s * 1000 * 1.5)
        try:
            response = await client.room_typing(room_id, typing, timeout=timeout_ms)
        except Exception as exc:
            # Typing is cosmetic: never fail a run because it could not be shown.
            log.info("matrix: typing notice for %s failed: %s", room_id, exc)
            return
        if isinstance(response, ErrorResponse):
            log.info("matrix: typing notice for %s failed: %s", room_id, response)

    def _room_id(self, room: RoomKey) -> RoomId:
        if room.transport != TRANSPORT:
            raise TransportError("matrix", f"not a Matrix room: {room}")
        return room.room_id

    def _content(self, msgtype: str, markdown: str) -> dict[str, Any]:
        return {
            "msgtype": msgtype,
            "body": markdown,
            "format": "org.matrix.custom.html",
            "formatted_body": self._renderer.html(markdown),
        }

    def _chunks(self, text: str, msgtype: str) -> list[str]:
        """Pieces of ``text`` whose events fit, whatever HTML and UTF-8 make of them."""
        limit = self._settings.max_event_chars
        pending = split_markdown(text, limit)
        fitted: list[str] = []
        while pending:
            chunk = pending.pop(0)
            size = len(json.dumps(self._content(msgtype, chunk)).encode())
            if size <= _MAX_EVENT_BYTES or len(chunk) < 256:
                fitted.append(chunk)
            else:
                pending[:0] = split_markdown(chunk, max(len(chunk) // 2, 64))
        return fitted

    async def _known_room(self, client: AsyncClient, room_id: RoomId) -> None:
        """Wait until a sync has shown the room (nio must know its members to encrypt).

        A reply can race the sync that tells us we joined (the joining and
        the answering are different requests); give it a few syncs.
        """
        try:
            async with asyncio.timeout(self._settings.sync_timeout_ms / 1000 * 3 + 10):
                while room_id not in client.rooms:
                    await self._synced.wait()
        except TimeoutError:
            raise TransportError("matrix", f"the bot is not in room {room_id}") from None

    async def _room_send(self, room_id: RoomId, content: dict[str, Any]) -> ExternalMessageId:
        client = self._client
        if client is None:
            raise TransportError("matrix", "not connected")
        await self._known_room(client, room_id)
        # One transaction id for every attempt: the server posts it once.
        tx_id = str(uuid4())
        backoff = Backoff(base=0.5, cap=5.0)
        problem = ""
        for attempt in range(1, self._send_attempts + 1):
            try:
                response = await client.room_send(
                    room_id, "m.room.message", content, tx_id=tx_id, ignore_unverified_devices=True
                )
            except (LocalProtocolError, OlmTrustError) as exc:
                raise TransportError("matrix", f"cannot send to {room_id}: {exc}") from exc
            except Exception as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if isinstance(response, RoomSendResponse):
                    return ExternalMessageId(response.event_id)
                if getattr(response, "status_code", None) in _REFUSED:
                    raise TransportError("matrix", f"send to {room_id} refused: {response}")
                problem = str(response)
            if attempt < self._send_attempts:
                await asyncio.sleep(backoff.next_delay())
        raise TransportError("matrix", f"send to {room_id} failed: {problem}")

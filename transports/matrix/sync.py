"""The sync loop: a loop of our own around nio's ``sync``.

Each round: sync from the saved position, keep the encryption keys in shape, accept invites
to configured rooms, hand every new message to the sink in order (undecryptable ones wait
for their key, :mod:`.undecryptable`; refused ones are set aside, :mod:`.setaside`), and only
then note the new position (:mod:`.position`). A failure backs off and replays from the
saved position (docs/deployment.md, "Inside the Matrix transport").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nio import (
    AsyncClient,
    JoinError,
    MegolmEvent,
    MessageDirection,
    RedactionEvent,
    RoomGetEventResponse,
    SyncResponse,
    TypingNoticeEvent,
)
from nio.exceptions import EncryptionError, LocalProtocolError

from bridge.core import stages
from bridge.core.model import ExternalMessageId, InboundMessage, RoomId
from bridge.core.transport import (
    ApprovalAction,
    AskKind,
    InboundEvent,
    InboundSink,
    MessageEdited,
    RoomBinding,
    SinkClosed,
    TransportError,
)
from transports.backoff import Backoff
from transports.matrix.approvals import MARKER, KnownRequests
from transports.matrix.client import RATE_LIMITED, Retryable, check
from transports.matrix.context import replied_to, with_context
from transports.matrix.inbound import (
    InboundPolicy,
    as_answer,
    history_before,
    to_inbound,
    to_typing,
)
from transports.matrix.position import PositionSaver
from transports.matrix.setaside import Offer, SetAsideEvents, Translate
from transports.matrix.settings import MatrixSettings
from transports.matrix.state import SetAsideFile, SyncPosition, UndecryptableFile
from transports.matrix.undecryptable import TellRoom, WaitingForKeys

log = logging.getLogger(__name__)

_SYNC_FILTER: dict[str, Any] = {
    # Presence and receipts are noise to the bridge; typing keeps a batch's
    # window open (docs/live-runs.md); room state is kept because nio needs
    # the members to encrypt.
    "presence": {"not_types": ["*"]},
    "account_data": {"not_types": ["*"]},
    "room": {
        "timeline": {"limit": 50},
        "ephemeral": {"types": ["m.typing"]},
        "account_data": {"not_types": ["*"]},
    },
}
_BACKFILL_PAGE = 100
_BACKFILL_LOG_EVERY = 2_000
_JOIN_BACKOFF_FIRST_S = 2.0
_JOIN_BACKOFF_CAP_S = 300.0
_NOT_JOINABLE = frozenset({"M_FORBIDDEN", "M_NOT_FOUND", "M_UNKNOWN", "M_BAD_JSON"})
"""A join refused for good (the invite was withdrawn, the room is gone)."""


class Synced:
    """Wakes whoever waits for the next completed sync (outbound waits for rooms)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    async def wait(self) -> None:
        await self._event.wait()

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()


class Syncer:
    """Runs the sync loop of one logged-in client; knows whether it is connected."""

    def __init__(
        self,
        settings: MatrixSettings,
        rooms: Mapping[RoomId, RoomBinding],
        policy: InboundPolicy,
        backoff: Backoff,
        tell_room: TellRoom,
        *,
        requests: KnownRequests | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``requests``: which events are approval requests (the outbound side notes its own)."""
        self._settings = settings
        self._requests = requests if requests is not None else KnownRequests()
        self._rooms = rooms
        self._policy = policy
        self._backoff = backoff
        self._clock = clock
        self._position = SyncPosition(settings.store_path)
        self._saver = PositionSaver(self._position)
        self._waiting = WaitingForKeys(
            UndecryptableFile(settings.store_path),
            self._hand_over,
            settings.undecryptable_notice_s,
            tell_room,
        )
        self._set_aside = SetAsideEvents(SetAsideFile(settings.store_path))
        self._joins: dict[str, _PendingJoin] = {}
        """Invites to configured rooms not joined yet, by room."""
        self.connected = False
        """True after a successful sync, until the next failed one."""
        self._lost_connection = False
        self.reconnects = 0
        self.synced = Synced()
        self._inbound_closed = False
        """The sink raised SinkClosed: sync only to stay able to send."""

    async def run(self, client: AsyncClient, sink: InboundSink, ready: asyncio.Event) -> None:
        """Sync until cancelled; ``ready`` is set after the first sync.

        Once the sink raises :class:`SinkClosed` the saved position stays where
        it is and nothing more is handed over, but the loop goes on (so the
        client can still send) until cancelled. Raises :class:`TransportError`
        when the server refuses the credentials.
        """
        saver = asyncio.create_task(self._saver.run(), name="matrix-sync-position")
        try:
            await self._loop(client, sink, ready)
        finally:
            self.connected = False
            saver.cancel()
            # Lets its last write finish (a failed write costs only a replay).
            await asyncio.wait([saver])
            if not saver.cancelled() and (problem := saver.exception()) is not None:
                log.error("matrix: saving the sync position failed: %r", problem)

    async def _loop(self, client: AsyncClient, sink: InboundSink, ready: asyncio.Event) -> None:
        token = self._position.load()
        first_start = token is None
        # nio keeps room state (members, encryption) only in memory: rebuild
        # it once with a full-state sync when resuming from a saved position.
        full_state = not first_start
        while True:
            try:
                response = await self._sync_once(client, token, full_state)
                if stages.enabled() and any(
                    info.timeline.events for info in response.rooms.join.values()
                ):
                    stages.stamp("received")
                if self._lost_connection:
                    # The server answers again: counted now, not after the
                    # response is handed over (which may take a while).
                    self.reconnects += 1
                    self._lost_connection = False
                await self._maintain_keys(client)
                await self._accept_invites(client, response)
                if first_start:
                    self._warn_unjoined(client)
                elif not self._inbound_closed:
                    await self._set_aside.retry(sink, self._translator(client))
                    await self._deliver(client, response, token, sink)
                    await self._typing(response, sink)
                    await self._waiting.retry(client, sink)
            except SinkClosed:
                # The service is shutting down and takes nothing more: leave the
                # saved position where it is, so the next start delivers what
                # this one could not. Keep syncing (in memory only) so the
                # client stays able to send, encrypted rooms included, until the
                # runs of the grace period have answered and we are cancelled.
                log.info("matrix: the service stopped accepting; no more input is taken")
                self._inbound_closed = True
            except TransportError:
                raise
            except Exception as exc:  # CancelledError is no Exception: it propagates
                if self.connected:
                    self._lost_connection = True
                self.connected = False
                delay = self._backoff.next_delay()
                if isinstance(exc, Retryable):
                    delay = max(delay, exc.retry_after_s)
                log.warning(
                    "matrix sync failed (%s: %s); retry %d in %.1fs",
                    type(exc).__name__,
                    exc,
                    self._backoff.failures,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            if not self._inbound_closed:
                # Everything in this response was accepted: only now may the
                # position move (saved off the loop, see .position).
                self._saver.note(response.next_batch)
            token, first_start, full_state = response.next_batch, False, False
            if not self.connected:
                log.info("matrix connected as %s (device %s)", client.user_id, client.device_id)
            self.connected = True
            self._backoff.reset()
            ready.set()
            self.synced.notify()

    async def _sync_once(self, client: AsyncClient, token: str | None, full: bool) -> SyncResponse:
        # nio ignores a response whose next_batch equals the one it saw last;
        # a sync retried from an older position must be processed again.
        client.next_batch = token or ""
        # Long-poll only once connected: the first sync should answer at once;
        # and no longer than until a pending join may be tried again.
        timeout_ms = self._settings.sync_timeout_ms if self.connected else 0
        if self._joins:
            due_in_s = min(j.due for j in self._joins.values()) - self._clock()
            timeout_ms = max(0, min(timeout_ms, int(due_in_s * 1000)))
        response = await client.sync(
            timeout=timeout_ms,
            sync_filter=_SYNC_FILTER,
            since=token,
            full_state=full or None,
        )
        check("sync", response)
        return response

    async def _maintain_keys(self, client: AsyncClient) -> None:
        """What nio's own loop does between syncs to keep encryption working."""
        if client.olm is None:
            return
        if client.should_upload_keys:
            check("keys upload", await client.keys_upload())
        if client.should_query_keys:
            check("keys query", await client.keys_query())
        if client.should_claim_keys:
            check("keys claim", await client.keys_claim(client.get_users_for_key_claiming()))
        for response in await client.send_to_device_messages():
            check("to-device", response)

    async def _accept_invites(self, client: AsyncClient, response: SyncResponse) -> None:
        """Join configured rooms the bot is invited to; a failed join is tried again later.

        The sync position moves past an invite, so an invite whose join
        failed (rate limited, a server error) is kept here and retried with
        backoff, at least as late as the server asks; one refused for good
        (withdrawn, no such room) is dropped.
        """
        if self._settings.auto_join != "configured":
            for room_id in response.rooms.invite:
                log.info("matrix: ignoring invite to %s (auto_join is none)", room_id)
            return
        for room_id in (*response.rooms.invite, *client.invited_rooms):
            if room_id in self._rooms:
                self._joins.setdefault(room_id, _PendingJoin(due=0.0))
            elif room_id in response.rooms.invite:
                log.info("matrix: ignoring invite to unconfigured room %s", room_id)
        for room_id, pending in list(self._joins.items()):
            if pending.due > self._clock():
                continue
            joined = await client.join(room_id)
            if not isinstance(joined, JoinError):
                log.info("matrix: joined configured room %s", room_id)
                del self._joins[room_id]
            elif joined.status_code in _NOT_JOINABLE:
                log.warning("matrix: cannot join %s: %s", room_id, joined)
                del self._joins[room_id]
            else:
                pending.failures += 1
                delay = min(
                    _JOIN_BACKOFF_CAP_S, _JOIN_BACKOFF_FIRST_S * 2 ** (pending.failures - 1)
                )
                if joined.status_code in RATE_LIMITED and joined.retry_after_ms:
                    delay = max(delay, joined.retry_after_ms / 1000)
                pending.due = self._clock() + delay
                log.warning(
                    "matrix: could not join %s (%s); trying again in %.1fs", room_id, joined, delay
                )

    def _warn_unjoined(self, client: AsyncClient) -> None:
        for room_id in self._rooms:
            if room_id not in client.rooms and room_id not in client.invited_rooms:
                log.warning("matrix: not a member of configured room %s; invite the bot", room_id)

    async def _deliver(
        self, client: AsyncClient, response: SyncResponse, since: str | None, sink: InboundSink
    ) -> None:
        """Hand the response's new events of configured rooms to the sink, in order.

        Consecutive messages go together (see :meth:`SetAsideEvents.offer_together`),
        so the store records a response's messages in one transaction rather
        than one commit after another; an edit or a deletion, which acts on
        what is already recorded, first waits for the messages before it.
        """
        together: list[Offer] = []
        for room_id, info in response.rooms.join.items():
            if room_id not in self._rooms:
                continue
            events = list(info.timeline.events)
            if info.timeline.limited and since:
                # More arrived while we were away than one sync carries.
                events = await self._backfill(client, room_id, info.timeline.prev_batch, since)
                events += info.timeline.events
            for event in events[history_before(events, self._policy.user_id) :]:
                if isinstance(event, MegolmEvent):
                    await self._waiting.keep(client, room_id, event)
                    continue
                if getattr(event, "event_id", None) in self._set_aside:
                    continue  # a replay of an event already set aside: it waits there
                inbound = await self._translate(client, room_id, event)
                if inbound is None:
                    continue
                if isinstance(inbound, InboundMessage):
                    together.append((room_id, event, inbound))
                    continue
                if together:
                    await self._set_aside.offer_together(sink, together)
                    together = []
                await self._set_aside.offer(sink, room_id, event, inbound)
        if together:
            await self._set_aside.offer_together(sink, together)

    async def _typing(self, response: SyncResponse, sink: InboundSink) -> None:
        """Who types in each configured room, as the response says: after its messages,
        so a window hears of typing once the message it waits for is queued."""
        for room_id, info in response.rooms.join.items():
            if room_id not in self._rooms:
                continue
            for event in info.ephemeral:
                if isinstance(event, TypingNoticeEvent):
                    await sink(to_typing(room_id, event))

    async def _hand_over(
        self, client: AsyncClient, room_id: str, event: object, sink: InboundSink
    ) -> None:
        """One readable event to the sink, decrypted late; as :meth:`_deliver` hands them.

        An edit by anyone but the original sender is dropped; a redaction
        also forgets the event it removes wherever it still waits here.
        """
        if getattr(event, "event_id", None) in self._set_aside:
            return  # a replay of an event already set aside: it waits there
        inbound = await self._translate(client, room_id, event)
        if inbound is not None:
            await self._set_aside.offer(sink, room_id, event, inbound)

    def _translator(self, client: AsyncClient) -> Translate:
        async def translate(room_id: str, event: object) -> InboundEvent | None:
            return await self._translate(client, room_id, event)

        return translate

    async def _translate(
        self, client: AsyncClient, room_id: str, event: object
    ) -> InboundEvent | None:
        if isinstance(event, RedactionEvent) and event.redacts:
            self._waiting.forget(event.redacts)
            self._set_aside.forget(event.redacts)
        inbound = to_inbound(event, room_id, self._policy, _own_name(client, room_id))
        if isinstance(inbound, MessageEdited) and not await self._same_sender(
            client, room_id, inbound.external_id, event
        ):
            return None
        if isinstance(inbound, ApprovalAction):
            kind = await self._request_kind(client, room_id, inbound.message_id)
            if not kind:
                return None  # a ✅ on anything else is just a reaction
            if inbound.answer and kind != AskKind.QUESTION.value:
                return None  # a 2️⃣ on a tool request or plan too
        if isinstance(inbound, InboundMessage):
            source = getattr(event, "source", None)
            content = source.get("content") if isinstance(source, dict) else None
            if isinstance(content, dict):
                answer = await self._answer_of(client, room_id, inbound, content)
                if answer is not None:
                    return answer
                inbound = await with_context(client, room_id, inbound, content)
        return inbound

    async def _answer_of(
        self, client: AsyncClient, room_id: str, message: InboundMessage, content: dict[str, Any]
    ) -> ApprovalAction | None:
        """A reply to a question request: its answer (any other message stays a message)."""
        question = replied_to(content)
        if question is None:
            return None
        kind = await self._request_kind(client, room_id, ExternalMessageId(question))
        if kind != AskKind.QUESTION.value:
            return None
        return as_answer(message, ExternalMessageId(question))

    async def _request_kind(self, client: AsyncClient, room_id: str, event_id: str) -> str:
        """The kind of approval request ``event_id`` is (``tool``, ``question``, ``plan``;
        marked, see .approvals), "" for any other event.

        Known for the requests this process posted; otherwise the event is
        fetched (and decrypted: the bot can read its own messages) once and
        the answer remembered.
        """
        known = self._requests.kind(event_id)
        if known is not None:
            return known
        response = await client.room_get_event(room_id, event_id)
        if not isinstance(response, RoomGetEventResponse):
            if getattr(response, "status_code", None) in ("M_NOT_FOUND", "M_FORBIDDEN"):
                self._requests.note(event_id, False)
                return ""
            check("fetch reacted-to event", response)
            return ""
        event: object = response.event
        if isinstance(event, MegolmEvent) and client.olm is not None:
            try:
                event = client.decrypt_event(event)
            except (EncryptionError, LocalProtocolError) as exc:
                # Not remembered: the key may still come (unlikely for the bot's own).
                log.warning("matrix: cannot read %s to check a reaction: %s", event_id, exc)
                return ""
        source = getattr(event, "source", None)
        content = source.get("content") if isinstance(source, dict) else None
        marker = content.get(MARKER) if isinstance(content, dict) else None
        is_request = getattr(event, "sender", None) == self._policy.user_id and isinstance(
            marker, dict
        )
        kind = str(marker.get("kind") or AskKind.TOOL.value) if isinstance(marker, dict) else ""
        self._requests.note(event_id, is_request, kind)
        return kind if is_request else ""

    async def _same_sender(
        self, client: AsyncClient, room_id: str, original: str, edit: object
    ) -> bool:
        """Whether an edit comes from the sender of the message it replaces.

        Clients show an edit by anyone else as a forgery; the bridge must not
        let one rewrite a queued prompt either. A lookup per edit: edits are rare.
        """
        response = await client.room_get_event(room_id, original)
        if isinstance(response, RoomGetEventResponse):
            if response.event.sender == getattr(edit, "sender", None):
                return True
            log.warning("matrix: ignoring an edit of %s by another sender", original)
            return False
        if getattr(response, "status_code", None) in ("M_NOT_FOUND", "M_FORBIDDEN"):
            return False  # nothing the bridge could have received
        check("fetch edited event", response)
        return False

    async def _backfill(
        self, client: AsyncClient, room_id: str, prev_batch: str | None, since: str
    ) -> list[Any]:
        """Events between ``since`` and a limited timeline's start, oldest first.

        Pages until ``since`` is reached, however long the gap: the position
        moves past all of them once handed over, so stopping early would lose
        the oldest. A failed page fails the round (retried from ``since``).
        """
        older: list[Any] = []
        cursor = prev_batch
        logged = 0
        while cursor:
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
            check("backfill", page)
            if not page.chunk:
                break
            older.extend(page.chunk)
            if len(older) - logged >= _BACKFILL_LOG_EVERY:
                logged = len(older)
                log.warning("matrix: catching up on %s: %d missed events so far", room_id, logged)
            if page.end == cursor:
                break  # no progress: the server has nothing older
            cursor = page.end
        older.reverse()
        return older


@dataclass(slots=True)
class _PendingJoin:
    due: float
    """Clock time of the next attempt."""
    failures: int = 0


def _own_name(client: AsyncClient, room_id: str) -> str | None:
    """The bot's display name in the room, as the room state shows it."""
    room = client.rooms.get(room_id)
    user = room.users.get(client.user_id) if room is not None else None
    name = getattr(user, "display_name", None)
    return name if isinstance(name, str) and name else None

"""Replies to Matrix: events rendered from Markdown, split to fit, sent with retries.

Results are ``m.text``; notices and progress are ``m.notice``. Typing notices
are renewed while a run is active, since the server expires them.
"""

from __future__ import annotations

import asyncio
import copy
import io
import logging
import mimetypes
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from uuid import uuid4

from nio import AsyncClient, ErrorResponse, MatrixRoom, RoomSendResponse, UploadResponse
from nio.exceptions import LocalProtocolError, OlmTrustError

from bridge.core import stages
from bridge.core.model import (
    Attachment,
    ExternalMessageId,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
)
from bridge.core.transport import (
    TOOL_ASKED,
    Asked,
    Delivery,
    Outbound,
    RateLimited,
    RunPhase,
    TransportError,
    Undeliverable,
)
from transports.backoff import Backoff
from transports.matrix.approvals import MARKER, WIDEST_HOWTO, KnownRequests, offered
from transports.matrix.client import AUTH_ERRORS, RATE_LIMITED
from transports.matrix.inbound import TRANSPORT
from transports.matrix.media import fetch
from transports.matrix.mentions import must_declare
from transports.matrix.render import MarkdownRenderer
from transports.matrix.settings import MatrixSettings
from transports.matrix.sizing import fits
from transports.matrix.sync import Synced
from transports.text import split_markdown

log = logging.getLogger(__name__)

_UNDELIVERABLE = frozenset(
    {"M_FORBIDDEN", "M_TOO_LARGE", "M_NOT_FOUND", "M_BAD_JSON", "M_NOT_JSON", "M_UNKNOWN_ROOM"}
)
"""The server refused this event for good: sending it again cannot help."""
_DEFAULT_RETRY_AFTER_MS = 1_000
ANSWER_FILE = "answer.md"


@dataclass(frozen=True, slots=True)
class FileToPost:
    data: bytes
    name: str
    mime: str


class MatrixOutbound(Outbound):
    """Sends through the transport's client while it is logged in (``client`` is set)."""

    name = TRANSPORT

    def __init__(
        self,
        settings: MatrixSettings,
        synced: Synced,
        *,
        typing_refresh_s: float,
        send_attempts: int,
        requests: KnownRequests | None = None,
    ) -> None:
        """``requests``: where the approval requests posted are noted (the sync side reads it)."""
        self._settings = settings
        self._requests = requests if requests is not None else KnownRequests()
        self._synced = synced
        self._typing_refresh_s = typing_refresh_s
        self._send_attempts = send_attempts
        self._renderer = MarkdownRenderer()
        self._typing: set[RoomId] = set()
        self._received: dict[RoomId, float] = {}
        """Rooms shown typing as a sign of life (not renewed), until a run's typing
        takes over or an outcome clears it: when it was sent (monotonic)."""
        self.client: AsyncClient | None = None
        """Set by the transport while logged in; None otherwise."""

    async def send(
        self, reply: Reply, delivery: Delivery | None = None, *, wait_for_room: bool = True
    ) -> ExternalMessageId | None:
        """Post ``reply`` as one or more events; returns the id of the last one posted.

        The first event answers ``in_reply_to``; a thread keeps every event in
        it. The split depends only on the reply, so every attempt of one
        ``delivery`` makes the same parts: the first ``parts_done`` are skipped,
        and part ``i`` is sent with transaction id ``{key}.{i}``, which the
        homeserver posts at most once for this device however often it is sent.
        Without ``wait_for_room`` a room no sync has shown yet is
        :class:`Undeliverable` at once (the sync loop itself must not wait for a sync).
        """
        room_id = room_id_of(reply.room)
        client = self._logged_in()
        parts = [] if self._as_file(reply) else self._parts(reply)
        key = delivery.key if delivery is not None else uuid4().hex
        first = delivery.parts_done if delivery is not None else 0
        if wait_for_room:
            await self._known_room(client, room_id)
        elif room_id not in client.rooms:
            raise Undeliverable("matrix", f"the bot is not in room {room_id}")
        # Rendered and the room known: what follows is the homeserver's.
        stages.stamp("request_started")
        if self._as_file(reply):
            # One part: the answer as a Markdown file, captioned.
            if first >= 1:
                return None
            data = reply.text.encode()
            caption = (
                f"The answer is long ({len(reply.text):,} characters), so it is attached as a file."
            )
            posted = await self._post_file(
                client,
                room_id,
                reply,
                FileToPost(data, ANSWER_FILE, "text/markdown"),
                caption=caption,
                tx_id=f"{key}.0",
            )
            if delivery is not None:
                await delivery.part_sent(0, posted)
            return posted
        last: ExternalMessageId | None = None
        for index in range(first, len(parts)):
            last = await self._room_send(client, room_id, parts[index], f"{key}.{index}")
            if delivery is not None:
                await delivery.part_sent(index, last)
        return last

    def _as_file(self, reply: Reply) -> bool:
        limit = self._settings.answer_file_chars
        return reply.kind is ReplyKind.RESULT and limit > 0 and len(reply.text) > limit

    async def send_file(self, reply: Reply, key: str) -> ExternalMessageId:
        """Upload the file ``reply.file`` and post it (``m.image`` for images, else
        ``m.file``) where :meth:`send` would post ``reply``, ``reply.text`` as its caption.

        In an encrypted room the upload is encrypted (nio) and the event carries
        the key in ``file``. The event's transaction id is ``{key}.0``: a retry
        may upload the media again, but posts the event once.
        """
        room_id = room_id_of(reply.room)
        client = self._logged_in()
        path = Path(reply.file or "")
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except OSError as exc:
            raise Undeliverable("matrix", f"cannot read the file to post: {exc}") from exc
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        await self._known_room(client, room_id)
        stages.stamp("request_started")
        return await self._post_file(
            client,
            room_id,
            reply,
            FileToPost(data, path.name, mime),
            caption=reply.text,
            tx_id=f"{key}.0",
        )

    async def _post_file(
        self,
        client: AsyncClient,
        room_id: RoomId,
        reply: Reply,
        file: FileToPost,
        *,
        caption: str,
        tx_id: str,
    ) -> ExternalMessageId:
        room = client.rooms.get(room_id)
        encrypted = room is not None and room.encrypted
        response, keys = await client.upload(
            lambda *_: io.BytesIO(file.data),
            content_type=file.mime,
            filename=file.name,
            encrypt=encrypted,
            filesize=len(file.data),
        )
        if not isinstance(response, UploadResponse):
            raise_refusal(room_id, response)
            raise TransportError("matrix", f"upload to {room_id} failed: {response}")
        msgtype = "m.image" if file.mime.startswith("image/") else "m.file"
        # A caption (Matrix 1.10): ``body`` is the text, ``filename`` the file's name.
        content: dict[str, Any] = (
            # No caption: the file's name is the body, and mentions no one either
            # (a file named "@room.txt" must not notify the room).
            self._content(msgtype, caption, room)
            if caption
            else self._declared({"msgtype": msgtype}, file.name, room)
        )
        content.update(
            {
                "body": caption or file.name,
                "filename": file.name,
                "info": {"mimetype": file.mime, "size": len(file.data)},
            }
        )
        if encrypted and keys is not None:
            content["file"] = {**keys, "url": response.content_uri}
        else:
            content["url"] = response.content_uri
        self._relate(reply, content, first=True)
        return await self._room_send(client, room_id, content, tx_id)

    def _relate(self, reply: Reply, content: dict[str, Any], *, first: bool) -> None:
        """Put ``content`` in the reply's thread; the first event answers ``in_reply_to``."""
        reply_to = reply.in_reply_to if first else None
        if reply.thread:
            content["m.relates_to"] = {
                "rel_type": "m.thread",
                "event_id": reply.thread,
                "is_falling_back": reply_to is None,
                "m.in_reply_to": {"event_id": reply_to or reply.thread},
            }
        elif reply_to:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}

    def _parts(self, reply: Reply) -> list[dict[str, Any]]:
        msgtype = "m.text" if reply.kind is ReplyKind.RESULT else "m.notice"
        room = self._room(room_id_of(reply.room))
        parts = self._fit(reply.text, lambda chunk: self._content(msgtype, chunk, room))
        for index, content in enumerate(parts):
            self._relate(reply, content, first=index == 0)
        return parts

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Replace a notice the bridge sent (live progress); long text is cut to one event."""
        room_id = room_id_of(room)
        client = self._logged_in()
        known = self._room(room_id)

        def edit_of(chunk: str) -> dict[str, Any]:
            new = self._content("m.notice", chunk, known)
            # The fallback for clients without edits shows the same HTML behind
            # a "* ": rendered once, not again for the starred text.
            fallback = {**new, "body": f"* {chunk}", "formatted_body": f"* {new['formatted_body']}"}
            return {
                **fallback,
                "m.new_content": new,
                "m.relates_to": {"rel_type": "m.replace", "event_id": message_id},
            }

        parts = self._fit(text, edit_of) or [edit_of("")]
        await self._known_room(client, room_id)
        await self._room_send(client, room_id, parts[0], uuid4().hex)

    def approval_fits(self, room: RoomKey, text: str) -> bool:
        """Whether a request of ``text`` is one event (see :meth:`post_approval`)."""
        return len(self._parts(Reply(room, f"{text}\n\n{WIDEST_HOWTO}"))) == 1

    async def post_approval(
        self, request: Reply, ref: str, asked: Asked = TOOL_ASKED
    ) -> ExternalMessageId:
        """Post an approval request as one message, then react ✅ 🔁 ❌ to it as the bot.

        One event whatever the length (the reactions belong to one): a text
        that does not fit (:meth:`approval_fits`) is posted shortened by the
        bridge, the whole in a file before it; the cut here is a safety net.
        The reactions are offered for convenience: one that
        cannot be added is logged, not raised (the request is posted; a
        person can still react or answer by command), so that the caller
        does not post the request again.
        """
        room_id = room_id_of(request.room)
        client = self._logged_in()
        keys, howto = offered(asked)
        parts = self._parts(replace(request, text=f"{request.text}\n\n{howto}"))
        content = parts[0]
        if len(parts) > 1:
            content["body"] += "\n…"
            content["formatted_body"] += "<p>…</p>"
        content[MARKER] = {"ref": ref, "kind": asked.kind.value}
        await self._known_room(client, room_id)
        event_id = await self._room_send(client, room_id, content, uuid4().hex)
        self._requests.note(event_id, True, asked.kind.value)
        reactions: list[str] = []
        # In an encrypted room nio sends reactions in the clear (it never
        # encrypts m.reaction); they only show which emoji to click.
        for key in keys:
            annotation = {
                "m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": key}
            }
            try:
                reactions.append(
                    await self._room_send(
                        client, room_id, annotation, uuid4().hex, event_type="m.reaction"
                    )
                )
            except TransportError as exc:
                log.warning("matrix: could not offer %s on approval %s: %s", key, ref, exc)
        self._requests.reactions[event_id] = reactions
        return event_id

    async def close_approval(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Edit the request into its outcome and take the bot's reactions back (known ones)."""
        await self.edit(room, message_id, text)
        client = self._logged_in()
        for reaction in self._requests.reactions.pop(message_id, []):
            try:
                response = await client.room_redact(room_id_of(room), reaction)
            except Exception as exc:
                response = exc
            if isinstance(response, ErrorResponse | Exception):
                # Cosmetic: the outcome is shown; a late reaction is answered "decided".
                log.info("matrix: could not take back reaction %s: %s", reaction, response)

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        """Matrix shows no phase on messages. A batch received is shown by the bot typing
        at once (the sign of life), not renewed: it lapses on its own if no run follows.
        The run's outcome, which comes after its answer, clears it."""
        room_id = room_id_of(room)
        client = self.client
        if phase is RunPhase.RECEIVED:
            if room_id in self._typing:
                return  # a run of the room shows typing already
            sent = self._received.get(room_id)
            now = time.monotonic()
            if sent is not None and now - sent < self._typing_refresh_s / 2:
                return  # shown, and far from lapsing: a burst costs one request
            self._received[room_id] = now
            if client is not None:
                await self._send_typing(client, room_id, True)
        elif phase is not RunPhase.RUNNING and room_id in self._received:
            del self._received[room_id]
            if room_id not in self._typing and client is not None:
                await self._send_typing(client, room_id, False)

    async def set_typing(self, room: RoomKey, typing: bool) -> None:
        """Show the bot typing while a run is active; renewed until cleared."""
        room_id = room_id_of(room)
        self._received.pop(room_id, None)  # the run's typing takes over, or is cleared
        if typing:
            self._typing.add(room_id)
        else:
            self._typing.discard(room_id)
        client = self.client
        if client is not None:
            await self._send_typing(client, room_id, typing)

    async def fetch_attachment(self, attachment: Attachment, dest: Path, limit_bytes: int) -> None:
        """Download a shared file (decrypted and hash-checked when encrypted, see .media)."""
        client = self.client
        if client is None:
            raise TransportError(self.name, "not logged in")
        await fetch(client, attachment, dest, limit_bytes)

    async def keep_typing(self, client: AsyncClient) -> None:
        """Renew the active typing notices before the server expires them; until cancelled."""
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

    def _content(self, msgtype: str, markdown: str, room: MatrixRoom | None) -> dict[str, Any]:
        content = {
            "msgtype": msgtype,
            "body": markdown,
            "format": "org.matrix.custom.html",
            "formatted_body": self._renderer.html(markdown),
        }
        return self._declared(content, markdown, room)

    def _declared(
        self, content: dict[str, Any], text: str, room: MatrixRoom | None
    ) -> dict[str, Any]:
        """``content``, declaring that it mentions no one where ``text`` could notify
        someone otherwise (an "@room", a member's name): see transports.matrix.mentions."""
        if must_declare(text, room, self._settings.user_id):
            content["m.mentions"] = {}
        return content

    def _room(self, room_id: RoomId) -> MatrixRoom | None:
        """The room as the last sync showed it (None before one did)."""
        client = self.client
        return client.rooms.get(room_id) if client is not None else None

    def _fit(self, text: str, build: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
        """The events for the pieces of ``text``, each small enough whatever HTML, JSON and
        encryption make of it.

        Each piece is built (its Markdown rendered) once: the event measured
        is the event sent.
        """
        pending = split_markdown(text, self._settings.max_event_chars)
        fitted: list[dict[str, Any]] = []
        while pending:
            chunk = pending.pop(0)
            content = build(chunk)
            if fits("m.room.message", content) or len(chunk) < 256:
                fitted.append(content)
            else:
                pending[:0] = split_markdown(chunk, max(len(chunk) // 2, 64))
        return fitted

    def _logged_in(self) -> AsyncClient:
        client = self.client
        if client is None:
            raise TransportError("matrix", "not connected")
        return client

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

    async def _room_send(
        self,
        client: AsyncClient,
        room_id: RoomId,
        content: dict[str, Any],
        tx_id: str,
        *,
        event_type: str = "m.room.message",
    ) -> ExternalMessageId:
        """Send one event; connection errors and server errors are retried a few times.

        Every attempt carries the same transaction id, so the server posts the
        event once (nio encrypts anew each time; the server answers a repeated
        transaction with the first event's id). A rate limit is not waited out
        here: :class:`RateLimited` tells the caller how long to wait.
        """
        backoff = Backoff(base=0.5, cap=5.0)
        problem = ""
        for attempt in range(1, self._send_attempts + 1):
            try:
                response = await client.room_send(
                    room_id,
                    event_type,
                    copy.deepcopy(content),
                    tx_id=tx_id,
                    ignore_unverified_devices=True,
                )
            except (LocalProtocolError, OlmTrustError) as exc:
                raise Undeliverable("matrix", f"cannot send to {room_id}: {exc}") from exc
            except Exception as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if isinstance(response, RoomSendResponse):
                    return ExternalMessageId(response.event_id)
                raise_refusal(room_id, response)
                problem = str(response)
            if attempt < self._send_attempts:
                await asyncio.sleep(backoff.next_delay())
        raise TransportError("matrix", f"send to {room_id} failed: {problem}")


def raise_refusal(room_id: str, response: object) -> None:
    """Raise what an error response means for a send, unless it is worth retrying."""
    code = getattr(response, "status_code", None)
    if code in RATE_LIMITED:
        retry_after_ms = getattr(response, "retry_after_ms", None) or _DEFAULT_RETRY_AFTER_MS
        raise RateLimited("matrix", retry_after_ms / 1000, f"send to {room_id} rate limited")
    if code in AUTH_ERRORS:
        raise TransportError("matrix", f"send to {room_id} refused: {code}")
    if code in _UNDELIVERABLE:
        raise Undeliverable("matrix", f"send to {room_id} refused: {response}")


def room_id_of(room: RoomKey) -> RoomId:
    """The Matrix room id of ``room``; refuses a room of another transport."""
    if room.transport != TRANSPORT:
        raise TransportError("matrix", f"not a Matrix room: {room}")
    return room.room_id

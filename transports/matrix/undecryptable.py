"""Encrypted messages whose room key has not arrived: kept, keys requested, retried.

A Megolm key can arrive after the message it unlocks (the sender's client
shared it late, or only another device of the bot has it). Such an event is
saved (:class:`~transports.matrix.state.UndecryptableFile`) before the sync
position moves past it, its key is requested from the bot's other devices
(``m.room_key_request``), and decryption is retried after every sync. Once
readable it is handed over exactly like a live message (the same checks: an
edit by anyone but the original sender is dropped). A redaction of a kept
event forgets it. If it stays unreadable for ``undecryptable_notice_s``, the
room is told once (without waiting: this runs inside the sync loop); after
:data:`KEEP_S` it is given up.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable

from nio import AsyncClient, MegolmEvent
from nio.exceptions import EncryptionError, LocalProtocolError

from bridge.core.model import RoomId
from bridge.core.transport import InboundSink, TransportError, Undeliverable
from transports.matrix.state import Undecryptable, UndecryptableFile

log = logging.getLogger(__name__)

KEEP_S = 7 * 24 * 3600.0
"""After this long a key is not coming: the event is forgotten."""

TellRoom = Callable[[RoomId, str, str], Awaitable[None]]
"""``tell(room, text, key)``: post a notice now, at most once per ``key``; raises
:class:`Undeliverable` at once for a room the bot is not in (it never waits)."""
HandOver = Callable[[AsyncClient, str, object, InboundSink], Awaitable[None]]
"""How a readable event of a room reaches the sink (the sync loop's own path)."""


class WaitingForKeys:
    """The undecryptable events of all rooms, persisted under ``store_path``."""

    def __init__(
        self,
        file: UndecryptableFile,
        hand_over: HandOver,
        notice_after_s: float,
        tell_room: TellRoom,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._file = file
        self._hand_over = hand_over
        self._notice_after_s = notice_after_s
        self._tell_room = tell_room
        self._clock = clock
        self._events = {e.event_id: e for e in file.load()}

    def __len__(self) -> int:
        return len(self._events)

    async def keep(self, client: AsyncClient, room_id: str, event: MegolmEvent) -> None:
        """Save ``event`` and ask the bot's other devices for its key."""
        if event.event_id in self._events:
            return
        log.warning(
            "matrix: cannot decrypt %s in %s yet; requesting its key", event.event_id, room_id
        )
        self._events[event.event_id] = Undecryptable(room_id, dict(event.source), self._clock())
        self._save()
        await _request_key(client, event)

    def forget(self, event_id: str) -> None:
        """Drop a kept event: it was redacted, so it must never run (nor be noticed)."""
        if self._events.pop(event_id, None) is not None:
            log.info("matrix: the undecryptable event %s was redacted; forgotten", event_id)
            self._save()

    async def retry(self, client: AsyncClient, sink: InboundSink) -> None:
        """Hand over what can be read now; tell rooms about what still cannot.

        A failure of the hand-over propagates (the sync loop retries); what
        was settled before it is saved.
        """
        changed = False
        now = self._clock()
        try:
            for entry in list(self._events.values()):
                if entry.event_id not in self._events:
                    continue  # a redaction handed over just now forgot it
                event = _megolm(entry)
                try:
                    decrypted = client.decrypt_event(event) if event is not None else None
                except EncryptionError:
                    decrypted = None
                if decrypted is not None:
                    await self._hand_over(client, entry.room_id, decrypted, sink)
                    log.info("matrix: decrypted %s after its key arrived", entry.event_id)
                    self._events.pop(entry.event_id, None)
                    changed = True
                elif now - entry.first_seen >= KEEP_S or event is None:
                    log.warning("matrix: giving up on decrypting %s", entry.event_id)
                    del self._events[entry.event_id]
                    changed = True
                elif not entry.noticed and now - entry.first_seen >= self._notice_after_s:
                    changed |= await self._tell(entry)
        finally:
            if changed:
                self._save()

    async def _tell(self, entry: Undecryptable) -> bool:
        """Tell the room once that ``entry`` cannot be read; whether it is settled."""
        try:
            await self._tell_room(RoomId(entry.room_id), _notice(entry), notice_key(entry))
        except Undeliverable as exc:
            # Not in the room (left, kicked) or refused for good: nobody to tell.
            log.warning(
                "matrix: cannot tell %s about %s (%s); not telling",
                entry.room_id,
                entry.event_id,
                exc,
            )
        except TransportError as exc:
            log.warning(
                "matrix: could not tell %s about %s: %s", entry.room_id, entry.event_id, exc
            )
            return False  # try again after the next sync
        entry.noticed = True
        return True

    def _save(self) -> None:
        self._file.save(list(self._events.values()))


def _megolm(entry: Undecryptable) -> MegolmEvent | None:
    event = MegolmEvent.from_dict(entry.source)
    if not isinstance(event, MegolmEvent):
        return None
    event.room_id = entry.room_id
    return event


async def _request_key(client: AsyncClient, event: MegolmEvent) -> None:
    try:
        response = await client.request_room_key(event)
    except LocalProtocolError:
        return  # already requested for this session
    except Exception as exc:
        # Asking is best effort: the key may still come unasked.
        log.info("matrix: key request for %s failed: %s", event.event_id, exc)
        return
    if hasattr(response, "status_code"):
        log.info("matrix: key request for %s failed: %s", event.event_id, response)


def notice_key(entry: Undecryptable) -> str:
    """The notice's delivery key, derived from the event: a crash between posting it
    and saving ``noticed`` cannot post it twice (the server dedupes the transaction)."""
    digest = hashlib.sha256(entry.event_id.encode("utf-8", "replace")).hexdigest()[:32]
    return f"undecryptable-{digest}"


def _notice(entry: Undecryptable) -> str:
    sender = entry.source.get("sender", "someone")
    return (
        f"I could not read a message from {sender}: it is encrypted and its key has not "
        "reached me. Please send it again; if the key arrives later I will still answer it."
    )

"""Encrypted messages whose room key has not arrived: kept, keys requested, retried.

A Megolm key can arrive after the message it unlocks (the sender's client
shared it late, or only another device of the bot has it). Such an event is
saved (:class:`~transports.matrix.state.UndecryptableFile`) before the sync
position moves past it, its key is requested from the bot's other devices
(``m.room_key_request``), and decryption is retried after every sync. Once
readable it is handed over like any message. If it stays unreadable for
``undecryptable_notice_s``, the room is told once; after
:data:`KEEP_S` it is given up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from nio import AsyncClient, MegolmEvent
from nio.exceptions import EncryptionError, LocalProtocolError

from bridge.core.model import RoomId
from bridge.core.transport import InboundSink, TransportError
from transports.matrix.inbound import InboundPolicy, to_inbound
from transports.matrix.state import Undecryptable, UndecryptableFile

log = logging.getLogger(__name__)

KEEP_S = 7 * 24 * 3600.0
"""After this long a key is not coming: the event is forgotten."""

TellRoom = Callable[[RoomId, str], Awaitable[None]]


class WaitingForKeys:
    """The undecryptable events of all rooms, persisted under ``store_path``."""

    def __init__(
        self,
        file: UndecryptableFile,
        policy: InboundPolicy,
        notice_after_s: float,
        tell_room: TellRoom,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._file = file
        self._policy = policy
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

    async def retry(self, client: AsyncClient, sink: InboundSink) -> None:
        """Hand over what can be read now; tell rooms about what still cannot."""
        changed = False
        now = self._clock()
        for entry in list(self._events.values()):
            event = _megolm(entry)
            try:
                decrypted = client.decrypt_event(event) if event is not None else None
            except EncryptionError:
                decrypted = None
            if decrypted is not None:
                inbound = to_inbound(decrypted, entry.room_id, self._policy)
                if inbound is not None:
                    await sink(inbound)
                log.info("matrix: decrypted %s after its key arrived", entry.event_id)
                del self._events[entry.event_id]
                changed = True
            elif now - entry.first_seen >= KEEP_S or event is None:
                log.warning("matrix: giving up on decrypting %s", entry.event_id)
                del self._events[entry.event_id]
                changed = True
            elif not entry.noticed and now - entry.first_seen >= self._notice_after_s:
                try:
                    await self._tell_room(RoomId(entry.room_id), _notice(entry))
                except TransportError as exc:
                    log.warning(
                        "matrix: could not tell %s about %s: %s", entry.room_id, entry.event_id, exc
                    )
                    continue
                entry.noticed = True
                changed = True
        if changed:
            self._save()

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


def _notice(entry: Undecryptable) -> str:
    sender = entry.source.get("sender", "someone")
    return (
        f"I could not read a message from {sender}: it is encrypted and its key has not "
        "reached me. Please send it again; if the key arrives later I will still answer it."
    )

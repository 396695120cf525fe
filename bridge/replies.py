"""Everything the bridge says goes through here, to the room's transport.

A failure to deliver is logged and swallowed: a chat server that is down
must not fail a run or the service (the transports reconnect on their own).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    Message,
    Reply,
    ReplyKind,
    RoomKey,
    TransportName,
)
from bridge.core.transport import RunPhase
from transports.base import Transport

log = logging.getLogger(__name__)


def in_conversation(batch: Batch, text: str, kind: ReplyKind) -> Reply:
    """A reply that belongs with ``batch``: answering its last message, in its thread."""
    return Reply(
        room=batch.room,
        text=text,
        kind=kind,
        in_reply_to=batch.last.external_id,
        thread=batch.first.thread,
        anchor=batch.first.external_id,
    )


class Replier:
    def __init__(self, transports: Mapping[TransportName, Transport]) -> None:
        self._transports = transports

    def _transport(self, room: RoomKey) -> Transport | None:
        transport = self._transports.get(room.transport)
        if transport is None:
            log.warning("no transport %s for room %s", room.transport, room)
        return transport

    async def send(self, reply: Reply) -> ExternalMessageId | None:
        transport = self._transport(reply.room)
        if transport is None:
            return None
        try:
            return await transport.send(reply)
        except Exception:
            log.warning("could not send to %s", reply.room, exc_info=True)
            return None

    async def say(self, room: RoomKey, text: str, *, about: Batch | None = None) -> None:
        """A notice; ``about`` keeps it in the batch's conversation (thread)."""
        if about is None:
            await self.send(Reply(room=room, text=text, kind=ReplyKind.NOTICE))
        else:
            await self.send(in_conversation(about, text, ReplyKind.NOTICE))

    async def answer(self, message: Message, text: str) -> None:
        """A notice answering ``message`` (a command): in its thread if it was in one.

        No anchor: a command's answer does not open a thread of its own.
        """
        await self.send(
            Reply(
                room=message.room,
                text=text,
                kind=ReplyKind.NOTICE,
                in_reply_to=message.external_id,
                thread=message.thread,
            )
        )

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        transport = self._transport(room)
        if transport is None:
            return
        try:
            await transport.edit(room, message_id, text)
        except Exception:
            log.warning("could not edit a message in %s", room, exc_info=True)

    async def typing(self, room: RoomKey, typing: bool) -> None:
        transport = self._transport(room)
        if transport is None:
            return
        try:
            await transport.set_typing(room, typing)
        except Exception:
            log.debug("could not set typing in %s", room, exc_info=True)

    async def phase(self, batch: Batch, phase: RunPhase) -> None:
        transport = self._transport(batch.room)
        if transport is None:
            return
        ids: Sequence[ExternalMessageId] = [m.external_id for m in batch.messages]
        try:
            await transport.set_phase(batch.room, ids, phase)
        except Exception:
            log.debug("could not show phase %s in %s", phase, batch.room, exc_info=True)

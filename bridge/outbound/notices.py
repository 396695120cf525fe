"""Every notice the bridge says to a room goes through the durable outbox.

Command answers, a run's notices (the database is failing, a lost session),
recovery notices: each is recorded in the outbox (one durable write) and
handed to the :class:`~bridge.outbound.outbox.Outbox`, which delivers it from its
own per-room worker, in recording order, honouring rate limits and retrying
until it arrives, exactly once (also across a restart). So a caller, the
sink included, returns as soon as the notice is recorded: no network call.

Cosmetics (progress, typing, phases) stay best effort, in
:class:`~bridge.outbound.replies.Replier`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from bridge.core.model import Batch, Message, Reply, ReplyKind, RoomKey
from bridge.core.text import safe_text
from bridge.outbound.outbox import Outbox
from bridge.outbound.replies import Replier, in_conversation
from bridge.store.base import OutboxStore, StoreError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Notices:
    store: OutboxStore
    outbox: Outbox
    replier: Replier
    """The fallback when the store cannot record a notice."""
    clock: Callable[[], float] = time.time

    async def send(self, reply: Reply) -> None:
        """Record ``reply`` in the outbox and hand it over; delivery happens later."""
        reply = replace(reply, text=safe_text(reply.text))
        try:
            entries = await self.store.enqueue([reply], self.clock())
        except StoreError:
            # Nothing durable can hold it (often the very failure the notice is
            # about): sent at once instead, best effort, without the outbox's
            # order, retries or restart guarantees.
            log.warning("could not record a notice for %s; sending it directly", reply.room)
            await self.replier.send(reply)
            return
        self.outbox.submit(entries)

    async def say(self, room: RoomKey, text: str, *, about: Batch | None = None) -> None:
        """A notice; ``about`` keeps it in the batch's conversation (thread). Without
        it, a thread conversation's notice still goes to its thread."""
        if about is None:
            thread = room.thread or None
            await self.send(Reply(room=room, text=text, kind=ReplyKind.NOTICE, thread=thread))
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

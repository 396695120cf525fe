"""Everything the bridge says outside the outbox goes through here, to the room's transport.

A failure to deliver is logged and swallowed: a chat server that is down
must not fail a run or the service (the transports reconnect on their own).
Answers, run outcomes and notices do not come this way: they are recorded
and delivered from the outbox (:mod:`bridge.outbound.outbox`, :mod:`bridge.outbound.notices`);
:meth:`Replier.send` carries a notice only when the store could not record it.

Progress, typing and phase reactions are cosmetic: they take their turn
from the transport's :class:`~bridge.outbound.pacing.Pacing` and are dropped, not
delayed, while the chat server rate-limits the bot, so they never stand in
front of an answer. Outgoing text is made safe (:func:`~bridge.core.text.safe_text`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    Reply,
    ReplyKind,
    RoomKey,
    TransportName,
)
from bridge.core.synthetic import is_synthetic
from bridge.core.text import safe_text
from bridge.core.transport import (
    TOOL_ASKED,
    ApprovalAction,
    Asked,
    Outbound,
    RateLimited,
    RunPhase,
    Transport,
)
from bridge.outbound.pacing import Pacing

_T = TypeVar("_T")

log = logging.getLogger(__name__)


def in_conversation(batch: Batch, text: str, kind: ReplyKind) -> Reply:
    """A reply that belongs with ``batch``: answering its last message, in its thread.

    Messages of schedules and webhooks are not in the chat: nothing answers them
    (a batch of only those is answered at the room's top level).
    """
    chat = [m for m in batch.messages if not is_synthetic(m)]
    return Reply(
        room=batch.room,
        text=text,
        kind=kind,
        in_reply_to=chat[-1].external_id if chat else None,
        thread=chat[0].thread if chat else None,
        anchor=chat[0].external_id if chat else None,
    )


DEFAULT_EDITS_PER_MINUTE = 60.0
APPROVAL_TRIES = 4
"""Posting (or closing) a tool request waits out this many rate limits before giving up."""


class Replier:
    def __init__(
        self,
        transports: Mapping[TransportName, Transport],
        pacing: Mapping[TransportName, Pacing] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transports = transports
        given = pacing or {}
        self._pacing = {
            name: given.get(name) or Pacing(DEFAULT_EDITS_PER_MINUTE, clock) for name in transports
        }

    def pacing(self, transport: TransportName) -> Pacing | None:
        """The transport's shared budget of cosmetic updates."""
        return self._pacing.get(transport)

    def rate_limited(self, transport: TransportName, retry_after_s: float) -> None:
        """A request to ``transport`` was rate-limited: cosmetics pause and slow down."""
        pacing = self._pacing.get(transport)
        if pacing is not None:
            pacing.rate_limited(retry_after_s)

    def _cosmetic(self, room: RoomKey) -> Outbound | None:
        """The room's transport, unless cosmetic updates are paused for it."""
        pacing = self._pacing.get(room.transport)
        if pacing is not None and pacing.limited():
            return None
        return self._transport(room)

    def _transport(self, room: RoomKey) -> Outbound | None:
        """The outbound side of the room's transport."""
        transport = self._transports.get(room.transport)
        if transport is None:
            log.warning("no transport %s for room %s", room.transport, room)
            return None
        return transport.outbound

    async def send(self, reply: Reply) -> ExternalMessageId | None:
        """Send a progress message (or a notice the store could not record) once, best effort."""
        if reply.kind is ReplyKind.PROGRESS:
            outbound = self._cosmetic(reply.room)
        else:
            outbound = self._transport(reply.room)
        if outbound is None:
            return None
        try:
            return await outbound.send(replace(reply, text=safe_text(reply.text)))
        except RateLimited as exc:
            self.rate_limited(reply.room.transport, exc.retry_after_s)
            log.warning("rate limited: a %s to %s was dropped", reply.kind.value, reply.room)
            return None
        except Exception:
            log.warning("could not send to %s", reply.room, exc_info=True)
            return None

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> bool:
        """Edit a progress message if the transport's budget allows it now.

        False when it was skipped (budget spent, rate-limited): the caller
        folds the text into a later edit. A failed edit counts as done.
        """
        outbound = self._cosmetic(room)
        pacing = self._pacing.get(room.transport)
        if outbound is None or (pacing is not None and not pacing.try_edit()):
            return False
        try:
            await outbound.edit(room, message_id, safe_text(text))
        except RateLimited as exc:
            self.rate_limited(room.transport, exc.retry_after_s)
            return False
        except Exception:
            log.warning("could not edit a message in %s", room, exc_info=True)
        return True

    async def typing(self, room: RoomKey, typing: bool) -> None:
        # Typing off is never skipped for a rate limit: a run's end clears typing
        # after its answer, whose delivery is the likeliest to be rate-limited, and
        # a transport renews typing until it is cleared (Matrix): skipped, the room
        # would show the bot typing until its next run.
        outbound = self._cosmetic(room) if typing else self._transport(room)
        if outbound is None:
            return
        try:
            await outbound.set_typing(room, typing)
        except RateLimited as exc:
            self.rate_limited(room.transport, exc.retry_after_s)
        except Exception:
            log.debug("could not set typing in %s", room, exc_info=True)

    async def phase(self, batch: Batch, phase: RunPhase) -> None:
        # The outcome is never skipped for a rate limit (the answer's delivery is the
        # likeliest to meet one): skipped, the message would show the run running for
        # good. One try; what the server refuses then is dropped.
        shown_for_good = phase not in (RunPhase.RECEIVED, RunPhase.RUNNING)
        outbound = self._transport(batch.room) if shown_for_good else self._cosmetic(batch.room)
        if outbound is None:
            return
        ids: Sequence[ExternalMessageId] = [
            m.external_id for m in batch.messages if not is_synthetic(m)
        ]
        if not ids:
            return  # no chat message to show it on
        try:
            await outbound.set_phase(batch.room, ids, phase)
        except RateLimited as exc:
            self.rate_limited(batch.room.transport, exc.retry_after_s)
        except Exception:
            log.debug("could not show phase %s in %s", phase, batch.room, exc_info=True)

    async def post_approval(
        self, request: Reply, ref: str, asked: Asked = TOOL_ASKED
    ) -> ExternalMessageId | None:
        """Post a tool-use request with its actions; None if it could not be posted.

        Not cosmetic: claude waits on it. A rate limit is waited out (a few
        times); a request that could not be posted is denied (nobody saw it).
        """
        outbound = self._transport(request.room)
        if outbound is None:
            return None
        safe = replace(request, text=safe_text(request.text))
        return await self._insisting(
            request.room, "a tool request", lambda: outbound.post_approval(safe, ref, asked)
        )

    async def _insisting(
        self, room: RoomKey, what: str, post: Callable[[], Awaitable[_T]]
    ) -> _T | None:
        """``post()``'s result, rate limits waited out (a few times); None if it failed."""
        for _ in range(APPROVAL_TRIES):
            try:
                return await post()
            except RateLimited as exc:
                self.rate_limited(room.transport, exc.retry_after_s)
                await asyncio.sleep(exc.retry_after_s)
            except Exception:
                log.warning("could not post %s to %s", what, room, exc_info=True)
                return None
        return None

    async def answer_action(self, action: ApprovalAction, text: str) -> None:
        """Tell the person behind a click or reaction what only they need to hear (why it
        decided nothing, or that its answer waits for a run slot); best effort."""
        outbound = self._transport(action.room)
        if outbound is None:
            return
        try:
            await outbound.answer_action(action, safe_text(text))
        except RateLimited as exc:
            self.rate_limited(action.room.transport, exc.retry_after_s)
        except Exception:
            log.warning("could not answer an action in %s", action.room, exc_info=True)

    def approval_fits(self, room: RoomKey, text: str) -> bool:
        """Whether a request of ``text`` shows whole in one message of ``room``."""
        outbound = self._transport(room)
        return outbound is None or outbound.approval_fits(room, safe_text(text))

    async def post_file(self, reply: Reply, key: str) -> bool:
        """Post the file ``reply.file`` now (a request's whole text); False if it was not."""
        outbound = self._transport(reply.room)
        if outbound is None:
            return False
        safe = replace(reply, text=safe_text(reply.text))

        async def post() -> bool:
            await outbound.send_file(safe, key)
            return True

        return await self._insisting(reply.room, "a file", post) is not None

    async def close_approval(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Show a request as decided (its buttons go); best effort, rate limits waited out."""
        outbound = self._transport(room)
        if outbound is None:
            return
        for _ in range(APPROVAL_TRIES):
            try:
                await outbound.close_approval(room, message_id, safe_text(text))
            except RateLimited as exc:
                self.rate_limited(room.transport, exc.retry_after_s)
                await asyncio.sleep(exc.retry_after_s)
                continue
            except Exception:
                log.warning("could not close a tool request in %s", room, exc_info=True)
            return

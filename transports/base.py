"""What a transport is, in core types only.

A transport connects one chat system to the service. It translates its
library's events into :class:`~bridge.model.InboundMessage` and hands each
to the sink, and it renders :class:`~bridge.model.Reply` back. Library types
(nio responses, Slack bodies) never cross this boundary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from bridge.model import (
    ExternalMessageId,
    InboundMessage,
    Reply,
    RoomId,
    RoomKey,
    TransportName,
)


class Accepted(StrEnum):
    """What the service did with an inbound message."""

    ACCEPTED = "accepted"
    """Durably recorded: the transport may now acknowledge it upstream."""
    DUPLICATE = "duplicate"
    """Seen before (redelivery): acknowledge, do nothing else."""
    IGNORED = "ignored"
    """Not for the bridge (unauthorized, bot, unconfigured room): acknowledge."""


InboundSink = Callable[[InboundMessage], Awaitable[Accepted]]
"""The service's entry point. Returns only after the message is durably recorded,
so a transport acknowledges upstream (Slack ack, Matrix sync position) after it."""


class RunPhase(StrEnum):
    """Where a batch stands; transports may show it (Slack reactions)."""

    RECEIVED = "received"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class RoomBinding:
    """A configured room as a transport needs to know it."""

    room_id: RoomId
    trigger: str = "all"
    """``"all"`` messages, or ``"mention"``: only messages that mention the bot."""
    reply_in_thread: bool = False
    """Answer in a thread under the batch's first message (Slack)."""


class SinkClosed(Exception):
    """Raised by the sink while the service shuts down: do not acknowledge the message."""


class TransportError(Exception):
    """A transport could not deliver or connect; carries the transport's name."""

    def __init__(self, transport: str, message: str) -> None:
        super().__init__(f"{transport}: {message}")
        self.transport = transport


class Transport:
    """Base class: optional capabilities default to doing nothing."""

    name: TransportName
    reconnects: int = 0
    """How often the transport reconnected to its peer (a metric)."""

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        """Connect, set ``ready``, then feed inbound messages to ``sink`` until cancelled.

        Reconnects with backoff on its own. Returning normally means the
        transport has no more input (the console at end of file).
        """
        raise NotImplementedError

    async def send(self, reply: Reply) -> ExternalMessageId | None:
        """Post a reply; returns the id of the (last) message posted, if any."""
        raise NotImplementedError

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Replace the text of a message the bridge sent (live progress)."""

    async def set_typing(self, room: RoomKey, typing: bool) -> None:
        """Show or clear a typing indicator while a run is active."""

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        """Show where the batch made of these messages stands."""

    @property
    def connected(self) -> bool:
        """True while the transport is connected to its peer (readiness)."""
        return True

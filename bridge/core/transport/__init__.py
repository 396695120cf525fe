"""The transport contract: what a chat transport and the service exchange, in core types only.

A :class:`Transport` is the face: its inbound side is :meth:`Transport.run`, which feeds the
sink (:mod:`.inbound`), and its outbound side is the :class:`Outbound` object in
``transport.outbound``, which the service calls (:mod:`.outbound`). What a transport raises
is in :mod:`.errors`. A transport that is its own outbound side (the console, test doubles)
is a :class:`Duplex`. The whole contract is described in docs/transports.md.
"""

from __future__ import annotations

import asyncio

from bridge.core.model import TransportName
from bridge.core.transport.errors import (
    FileTooLarge,
    RateLimited,
    TransportError,
    Undeliverable,
)
from bridge.core.transport.inbound import (
    Accepted,
    ApprovalAction,
    ApprovalChoice,
    InboundEvent,
    InboundSink,
    MessageDeleted,
    MessageEdited,
    RoomBinding,
    SeenMarks,
    SinkClosed,
    Typing,
)
from bridge.core.transport.outbound import (
    TOOL_ASKED,
    Asked,
    AskedQuestion,
    AskKind,
    Delivery,
    Outbound,
    PartSent,
    RunPhase,
)


class Transport:
    """One chat connection: it feeds the sink (:meth:`run`) and answers through ``outbound``."""

    name: TransportName
    outbound: Outbound
    """Where the service sends, edits and shows (set by each transport)."""
    reconnects: int = 0
    """How often the transport reconnected to its peer (a metric)."""

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        """Connect, set ``ready``, then feed inbound messages to ``sink`` until cancelled.

        Reconnects with backoff on its own. Returning normally means the
        transport has no more input (the console at end of file).
        """
        raise NotImplementedError

    @property
    def connected(self) -> bool:
        """True while the transport is connected to its peer (readiness)."""
        return True


class Duplex(Transport, Outbound):
    """A transport that is its own outbound side (one object both reads and posts)."""

    @property
    def outbound(self) -> Outbound:  # type: ignore[override]  # read-only: it is always itself
        return self


__all__ = [
    "TOOL_ASKED",
    "Accepted",
    "ApprovalAction",
    "ApprovalChoice",
    "AskKind",
    "Asked",
    "AskedQuestion",
    "Delivery",
    "Duplex",
    "FileTooLarge",
    "InboundEvent",
    "InboundSink",
    "MessageDeleted",
    "MessageEdited",
    "Outbound",
    "PartSent",
    "RateLimited",
    "RoomBinding",
    "RunPhase",
    "SeenMarks",
    "SinkClosed",
    "Transport",
    "TransportError",
    "Typing",
    "Undeliverable",
]

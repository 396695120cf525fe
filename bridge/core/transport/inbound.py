"""The inbound side of a transport: what it hands the service, in core types only.

A transport hands the :data:`InboundSink` one :data:`InboundEvent` at a time (a message, an
edit or deletion, an :class:`ApprovalAction`, a :class:`Typing`) and acknowledges it upstream
only once the sink returned :class:`Accepted`. It serves the rooms :class:`RoomBinding` names
and may keep where it got to in :class:`SeenMarks` (docs/transports.md, "Inbound").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)


class Accepted(StrEnum):
    """What the service did with an inbound event."""

    ACCEPTED = "accepted"
    """Durably recorded: the transport may now acknowledge it upstream."""
    DUPLICATE = "duplicate"
    """Seen before (redelivery): acknowledge, do nothing else."""
    IGNORED = "ignored"
    """Not for the bridge (unauthorized, bot, unconfigured room, an edit of a
    message that already ran): acknowledge."""


@dataclass(frozen=True, slots=True)
class MessageEdited:
    """A sender replaced the text of a message handed over before."""

    room: RoomKey
    external_id: ExternalMessageId
    """The transport's id of the original message (not of the edit event)."""
    text: str
    sender: UserId | None = None
    """Who edited it, when the transport knows (the platforms let only the author edit)."""


@dataclass(frozen=True, slots=True)
class MessageDeleted:
    """A message handed over before was deleted (Slack) or redacted (Matrix)."""

    room: RoomKey
    external_id: ExternalMessageId
    sender: UserId | None = None
    """Who deleted it, when the transport knows (may be an admin, not the author)."""


class ApprovalChoice(StrEnum):
    """What a person answered to a tool-use approval request."""

    ALLOW = "allow"
    """Allow this one tool use."""
    ALLOW_SESSION = "allow_session"
    """Allow it, and the like of it for the rest of the session."""
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class ApprovalAction:
    """A person acted on an approval request the bridge posted (a button, a reaction).

    The transport only says who chose what on which message; whether the
    sender may decide, and which approval the message is, is the service's
    business (it records the posted message's id with the approval).
    """

    room: RoomKey
    sender: UserId
    message_id: ExternalMessageId
    """The transport's id of the approval request message (as ``post_approval`` returned it)."""
    choice: ApprovalChoice
    answer: str = ""
    """A question's answer as ``!answer`` reads it (``2``, ``1,3``, words; ``;`` between
    questions): a Slack option button or submit, a Matrix reply or number reaction."""
    guide: bool = False
    """The person asked how to answer (Slack's "Keep planning"): tell them, decide nothing."""


@dataclass(frozen=True, slots=True)
class Typing:
    """Who types in a room now (all of them: anyone not named stopped).

    Nothing is recorded: it only keeps a waiting batch's window open while its
    senders type (docs/live-runs.md). A transport that knows (Matrix's
    ``m.typing``) hands it over after the messages it came with.
    """

    room: RoomKey
    users: frozenset[UserId]


InboundEvent = InboundMessage | MessageEdited | MessageDeleted | ApprovalAction | Typing

InboundSink = Callable[[InboundEvent], Awaitable[Accepted]]
"""The service's entry point. Returns only after the event is durably recorded,
so a transport acknowledges upstream (Slack ack, Matrix sync position) after it.
Raises :class:`SinkClosed` when it cannot take the event: do not acknowledge it.
A message reaches the store's queue before the sink's first wait, so a
transport may start several calls one after the other without awaiting them
and they are recorded in that order (and together, see bridge.store.batching);
within a room they also take effect in that order (queued, a command carried
out, an edit made), each call returning once its own has (bridge.inbound.room_order)."""


class SeenMarks(Protocol):
    """Where a transport got to in each room and thread, kept across restarts.

    A transport without a sync position of its own (Slack) reads what it
    missed from the room's history, from the newest message it saw there
    (docs/conversations.md, "Messages sent while chatbridge was down"). Keys
    are conversation keys whose ``thread`` is "" for the room's own timeline;
    ids compare as text, so a transport keeps them of one length (Slack ts).
    """

    async def seen_marks(self, transport: TransportName) -> dict[RoomKey, ExternalMessageId]:
        """The newest message seen in each room and thread of ``transport``."""
        ...

    async def mark_seen(self, marks: Mapping[RoomKey, ExternalMessageId], at: float) -> None:
        """Record each mark (seen at ``at``) in one transaction; an older id than the
        one kept changes nothing (marks never go back, whichever replica writes)."""
        ...


@dataclass(frozen=True, slots=True)
class RoomBinding:
    """A configured room as a transport needs to know it."""

    room_id: RoomId
    trigger: str = "all"
    """``"all"`` messages, or ``"mention"``: only messages that mention the bot."""
    reply_in_thread: bool = False
    """Answer in a thread under the batch's first message (Slack)."""


class SinkClosed(Exception):
    """Raised by the sink while the service shuts down: do not acknowledge the event."""

"""What a transport and the service exchange, in core types only.

Inbound, a transport hands the sink one :data:`InboundEvent` at a time (a message, an edit or
deletion, an :class:`ApprovalAction`, a :class:`Typing`). Outbound, the service calls the
``Transport`` with a :class:`~bridge.core.model.Reply` and, from the outbox, a :class:`Delivery`
that makes sending idempotent across retries and restarts. Errors a transport raises::

    TransportError        could not deliver or connect (retry later)
    ├── RateLimited       the server said "too many requests": wait retry_after_s
    ├── Undeliverable     the server refused this reply for good (no retry helps)
    └── FileTooLarge      a file being fetched turned out larger than its limit
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from bridge.core.model import (
    Attachment,
    ExternalMessageId,
    InboundMessage,
    Reply,
    ReplyKind,
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


class AskKind(StrEnum):
    """What a request asks of the room."""

    TOOL = "tool"
    """A tool use: allow once, for the session, or deny."""
    QUESTION = "question"
    """claude's questions (AskUserQuestion): answered with options or words."""
    PLAN = "plan"
    """claude's plan (ExitPlanMode): start with edits asked, with edits accepted, or keep
    planning."""


@dataclass(frozen=True, slots=True)
class AskedQuestion:
    options: tuple[str, ...]
    """The options' labels, numbered from 1."""
    multi: bool


@dataclass(frozen=True, slots=True)
class Asked:
    """What a posted request asks, so a transport offers the actions that answer it."""

    kind: AskKind = AskKind.TOOL
    questions: tuple[AskedQuestion, ...] = ()


TOOL_ASKED = Asked()
"""A tool-use request's: allow once, for the session, or deny."""


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


PartSent = Callable[[int, ExternalMessageId], Awaitable[None]]
"""Called after part ``index`` (0-based) of a reply was delivered, with its id."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """How to send one outbox entry so that retries never post a part twice.

    The transport splits the reply the same way on every attempt, skips the
    first ``parts_done`` parts, and awaits ``part_sent`` after each part it
    posts (the outbox records it durably). ``key`` is stable across attempts
    and restarts: a transport derives per-part idempotency keys from it
    (Matrix transaction ids ``{key}.{index}``; a Slack message's metadata).
    """

    key: str
    parts_done: int
    part_sent: PartSent


class SinkClosed(Exception):
    """Raised by the sink while the service shuts down: do not acknowledge the event."""


class TransportError(Exception):
    """A transport could not deliver or connect; carries the transport's name."""

    def __init__(self, transport: str, message: str) -> None:
        super().__init__(f"{transport}: {message}")
        self.transport = transport


class RateLimited(TransportError):
    """The server rate-limited the request; try again after ``retry_after_s``."""

    def __init__(self, transport: str, retry_after_s: float, message: str = "rate limited") -> None:
        super().__init__(transport, f"{message} (retry after {retry_after_s:g}s)")
        self.retry_after_s = retry_after_s


class Undeliverable(TransportError):
    """The server refused this reply for good (too large, no such room, not a member)."""


class FileTooLarge(TransportError):
    """A file being fetched (``Transport.fetch_attachment``) grew past ``limit_bytes``;
    what was written is incomplete."""

    def __init__(self, transport: str, limit_bytes: int) -> None:
        super().__init__(transport, f"the file is larger than {limit_bytes} bytes")
        self.limit_bytes = limit_bytes


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

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        """Post a reply; returns the id of the (last) message posted, if any.

        With ``delivery`` (answers from the outbox) the transport skips the
        parts already delivered and reports each part it posts, so a retry or
        a restart never posts a part twice. Raises
        :class:`~bridge.core.transport.RateLimited` when the server asks to
        wait (without waiting itself), :class:`~bridge.core.transport.Undeliverable`
        when no retry can help, and ``TransportError`` otherwise.
        """
        raise NotImplementedError

    async def send_file(self, reply: Reply, key: str) -> ExternalMessageId | None:
        """Post the file ``reply.file`` (a path; its base name is the name shown) with
        ``reply.text`` as its comment, where ``send`` would post ``reply``; returns the id
        of the message that shows it.

        ``key`` is stable across attempts and restarts (the outbox entry's): a
        transport derives its idempotency key from it where the server has one
        (a Matrix transaction id). Raises as :meth:`send` does; by default the
        transport cannot post files (:class:`~bridge.core.transport.Undeliverable`).
        """
        raise Undeliverable(self.name, "this transport cannot post files")

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Replace the text of a message the bridge sent (live progress)."""

    async def post_approval(
        self, request: Reply, ref: str, asked: Asked = TOOL_ASKED
    ) -> ExternalMessageId | None:
        """Post an approval request with the actions that answer it; returns its message id.

        ``request`` says where (room, thread, the message answered) and what
        (the text, Markdown); ``ref`` names the approval as commands name it
        (``#3``); ``asked`` what it asks (a tool use, claude's questions with
        their options, a plan). A transport with actions of its own (Slack
        buttons, Matrix reactions) attaches the ones that answer it and later
        hands each use of one (a question's answer in ``answer``) to the sink
        as an :class:`~bridge.core.transport.ApprovalAction` carrying the id
        returned here. By default the request is a plain reply, answered
        through commands only. Raises as :meth:`send` does.
        """
        return await self.send(request)

    async def answer_action(self, action: ApprovalAction, text: str) -> None:
        """Tell the person behind ``action`` (a click, a reaction) why it decided nothing,
        as privately as the chat allows. By default a reply to the request (Matrix: a
        reply everyone sees; a terminal: a line)."""
        await self.send(Reply(action.room, text, ReplyKind.NOTICE, in_reply_to=action.message_id))

    def approval_fits(self, room: RoomKey, text: str) -> bool:
        """Whether a request whose text (Markdown) is ``text`` shows whole in one message
        of ``room``; if not, the bridge posts the whole as a file first and the request
        shortened. By default (a terminal) every text fits."""
        return True

    async def close_approval(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Show an approval request as decided (``text``: its outcome); its actions go.

        By default an :meth:`edit` of the request message.
        """
        await self.edit(room, message_id, text)

    async def set_typing(self, room: RoomKey, typing: bool) -> None:
        """Show or clear a typing indicator while a run is active."""

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        """Show where the batch made of these messages stands."""

    async def fetch_attachment(self, attachment: Attachment, dest: Path, limit_bytes: int) -> None:
        """Write the content of ``attachment`` (one this transport handed over) to ``dest``.

        ``dest`` exists, empty and private (0600), reached through its own open
        fd (``/proc/self/fd/N``: never a name that can be swapped for a link):
        write it in place (open it for writing), never replace or move it.

        Stops with :class:`~bridge.core.transport.FileTooLarge` once more than
        ``limit_bytes`` arrived (``dest`` then holds a part: the caller removes
        it), and checks what the transport can check (Matrix: the encrypted
        file's hash). Raises ``TransportError`` when the file cannot be had.
        By default: a transport that hands over no files fetches none.
        """
        raise TransportError(self.name, "this transport does not fetch files")

    @property
    def connected(self) -> bool:
        """True while the transport is connected to its peer (readiness)."""
        return True

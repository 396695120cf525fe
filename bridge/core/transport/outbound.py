"""The outbound side of a transport: what the service asks of the chat.

An :class:`Outbound` posts a :class:`~bridge.core.model.Reply` (from the outbox with a
:class:`Delivery`, which makes sending idempotent across retries and restarts), edits it,
posts and closes approval requests (:class:`Asked` says what one asks), shows typing and a
batch's :class:`RunPhase`, and fetches a file an inbound message carried. Optional
capabilities default to doing nothing (docs/transports.md, "Outbound").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from bridge.core.model import (
    Attachment,
    ExternalMessageId,
    Reply,
    ReplyKind,
    RoomKey,
    TransportName,
)
from bridge.core.transport.errors import TransportError, Undeliverable
from bridge.core.transport.inbound import ApprovalAction


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


class RunPhase(StrEnum):
    """Where a batch stands; transports may show it (Slack reactions)."""

    RECEIVED = "received"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"


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


class Outbound:
    """What the service asks of one transport's chat; a base whose optional capabilities
    default to doing nothing (or to a plain reply)."""

    name: TransportName

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

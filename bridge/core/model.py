"""Core types shared by every package.

Transports translate their library's objects into these at their edge; the
dispatcher, the runner and the store see nothing else. Distinct ``NewType``
ids keep a Slack channel id from being passed where a run id belongs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import NewType

TransportName = NewType("TransportName", str)
"""``"console"``, ``"matrix"`` or ``"slack"``."""

RoomId = NewType("RoomId", str)
"""A room's id within its transport (Matrix room id, Slack channel id)."""

UserId = NewType("UserId", str)
"""A sender's id within its transport."""

ExternalMessageId = NewType("ExternalMessageId", str)
"""The transport's own id of a message (Matrix event id, Slack ts)."""

MessageId = NewType("MessageId", int)
"""The store's id of an accepted message; increases in acceptance order."""

RunId = NewType("RunId", str)
"""A run's id, also the marker that finds the run's processes."""

SessionId = NewType("SessionId", str)
"""A Claude Code session id, passed back with ``--resume``."""


CONVERSATION_ID_LENGTH = 255
"""The longest ``room/thread`` a conversation's key spells: what the store's id
columns hold. Matrix allows 255 bytes for a room id and as many for an event
id (a thread root), so the two together may not fit as they are."""
THREAD_DIGEST_LENGTH = 33
"""``#`` and 128 bits of a digest: a thread id too long to spell in a key."""
MAX_THREAD_ROOM_ID = CONVERSATION_ID_LENGTH - 1 - THREAD_DIGEST_LENGTH
"""The longest room id whose threads can be conversations (checked by the configuration)."""


@dataclass(frozen=True, slots=True, order=True)
class RoomKey:
    """A conversation, unique across transports: a room, or one thread of it.

    Rooms configured with ``conversation = "thread"`` hold one conversation
    per thread, each with its own dispatch, session and answers; its key
    carries the thread root's id. Settings belong to the room
    (:attr:`channel`); transports address ``room_id`` and the reply's thread.
    """

    transport: TransportName
    room_id: RoomId
    thread: str = ""
    """The thread root's id (Slack ts, Matrix event id); "" for the room itself."""

    def __str__(self) -> str:
        base = f"{self.transport}:{self.room_id}"
        return f"{base}/{self.thread}" if self.thread else base

    @property
    def channel(self) -> RoomKey:
        """The room this conversation belongs to (itself for a room-wide one)."""
        return RoomKey(self.transport, self.room_id) if self.thread else self

    def in_thread(self, thread: str) -> RoomKey:
        """The conversation of ``thread`` in this key's room.

        A thread whose id does not fit beside the room's within
        :data:`CONVERSATION_ID_LENGTH` is named by a digest of it (the same one
        every time); its messages keep the real id, which replies go to.
        """
        if len(self.room_id) + 1 + len(thread) > CONVERSATION_ID_LENGTH:
            digest = hashlib.sha256(thread.encode()).hexdigest()
            thread = "#" + digest[: THREAD_DIGEST_LENGTH - 1]
        return RoomKey(self.transport, self.room_id, thread)


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file shared with a message, as the transport described it (not its content).

    The file is fetched when the message's run is prepared, through the
    transport that handed it over (``Outbound.fetch_attachment``): ``ref`` is
    that transport's own handle for it, opaque to everything else, and stored
    with the message so a restart can still fetch it.
    """

    name: str
    """The file name the sender gave (untrusted: sanitized before it names a file)."""
    mime: str
    """The MIME type the transport reported; ``"application/octet-stream"`` if none."""
    size: int | None
    """Bytes, as the transport reported them; None if it did not say."""
    ref: str
    """The transport's handle for fetching the content (a URL, an ``mxc://`` URI and keys)."""


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A message as a transport hands it to the service, before it is stored."""

    room: RoomKey
    sender: UserId
    text: str
    external_id: ExternalMessageId
    thread: str | None = None
    """Transport thread handle (Slack thread ts) the message belongs to, if any."""
    sender_is_bot: bool = False
    """The transport knows the sender is a bot (or the bridge itself)."""
    mentions_bot: bool = False
    """The message mentions the bot (used by Slack's ``trigger = "mention"``)."""
    attachments: tuple[Attachment, ...] = ()
    """Files shared with the message; a message of files without text is a message too."""
    sender_name: str | None = None
    """The sender's display name, as the transport knew it when the message came."""
    reply_to_text: str | None = None
    """The text of the message this one replies to (Matrix replies), resolved by the
    transport; the prompt quotes it, shortened."""

    def accepted(self, message_id: MessageId, received_at: float) -> Message:
        """This message as the store recorded it."""
        return Message(
            id=message_id,
            room=self.room,
            sender=self.sender,
            text=self.text,
            external_id=self.external_id,
            received_at=received_at,
            thread=self.thread,
            attachments=self.attachments,
            sender_name=self.sender_name,
            reply_to_text=self.reply_to_text,
        )


@dataclass(frozen=True, slots=True)
class Message:
    """An accepted message: recorded in the store, carrying the store's id."""

    id: MessageId
    room: RoomKey
    sender: UserId
    text: str
    external_id: ExternalMessageId
    received_at: float
    """Wall-clock seconds since the epoch when the service accepted it."""
    thread: str | None = None
    attachments: tuple[Attachment, ...] = ()
    sender_name: str | None = None
    reply_to_text: str | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """Messages of one room that go into one run, in arrival order."""

    room: RoomKey
    messages: tuple[Message, ...]

    @property
    def first(self) -> Message:
        return self.messages[0]

    @property
    def last(self) -> Message:
        return self.messages[-1]

    @property
    def ids(self) -> tuple[MessageId, ...]:
        return tuple(m.id for m in self.messages)


class MessageState(StrEnum):
    PENDING = "pending"
    DISPATCHED = "dispatched"
    DONE = "done"
    DROPPED = "dropped"
    FAILED = "failed"


class RunStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    TIMED_OUT = "timed_out"
    STALLED = "stalled"
    INTERRUPTED = "interrupted"

    @property
    def retryable(self) -> bool:
        """``!retry`` re-dispatches the messages of runs that ended like this."""
        return self in _RETRYABLE


_RETRYABLE = frozenset(
    {RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.STALLED, RunStatus.INTERRUPTED}
)


class ReplyKind(StrEnum):
    RESULT = "result"
    """Claude's final answer: rendered as a normal message."""
    NOTICE = "notice"
    """Command answers, errors, status: rendered as a notice where supported."""
    PROGRESS = "progress"
    """Live progress of a run (tool uses)."""


@dataclass(frozen=True, slots=True)
class Reply:
    """Something the bridge says in a room."""

    room: RoomKey
    text: str
    """Markdown; each transport renders it as well as it can."""
    kind: ReplyKind = ReplyKind.NOTICE
    in_reply_to: ExternalMessageId | None = None
    """The message answered: a batch's last message, or a command."""
    thread: str | None = None
    """The thread the conversation is already in, if any."""
    anchor: ExternalMessageId | None = None
    """The batch's first message: a transport that answers in a new thread
    (Slack's ``reply_in_thread``) opens it under this one."""
    file: str | None = None
    """A file to post (``Outbound.send_file``), ``text`` its comment: the path of the
    bridge's own copy, whose base name is the name the room sees (docs/files.md)."""


@dataclass(frozen=True, slots=True)
class RunReport:
    """How a run ended, as the service records and reports it."""

    status: RunStatus
    exit_code: int | None = None
    session_id: SessionId | None = None
    cost_usd: float | None = None
    num_turns: int | None = None
    duration_ms: int | None = None
    result_text: str = ""
    error: str = ""
    """Short, human-readable reason when the run did not succeed."""
    session_not_found: bool = False
    """``--resume`` named a session claude does not know; run again without it."""
    not_started: bool = False
    """claude was not started: the conversation had moved to another replica (this one
    paused past its lease after recording the start). Nothing of the run is to be
    recorded here: its new owner recovers it (its messages run there, once)."""


@dataclass(frozen=True, slots=True)
class LiveRun:
    """Where a run's detached supervisor is reached: what the registry of live runs keeps.

    The supervisor outlives the bridge (docs/detached-runs.md); a restarted
    bridge finds it again through this, on the same host.
    """

    run_id: RunId
    supervisor_pid: int
    supervisor_start: int
    """The supervisor's start time (``/proc/PID/stat`` field 22, clock ticks after
    boot): a pid that was recycled since has another, so it is never mistaken."""
    claude_pid: int
    run_dir: str
    """The run's private directory: its socket (``sock``) and journal (``journal``)."""
    host: str
    """The host the supervisor runs on; only a bridge there can reach it."""

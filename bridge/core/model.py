"""Core types shared by every package.

Transports translate their library's objects into these at their edge; the
dispatcher, the runner and the store see nothing else. Distinct ``NewType``
ids keep a Slack channel id from being passed where a run id belongs.
"""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True, order=True)
class RoomKey:
    """A room, unique across transports."""

    transport: TransportName
    room_id: RoomId

    def __str__(self) -> str:
        return f"{self.transport}:{self.room_id}"


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
    files: int = 0
    """Files shared with the message. They are not passed to claude yet: a
    message of files without text is answered with a notice, never run."""

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
    """A file to post (``Transport.send_file``), ``text`` its comment: the path of the
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

"""Chat commands: ``!stop``, ``!status``, ``!reset``, ``!retry``, ``!help``, and for live
runs ``!approve``, ``!deny``, ``!rules``, ``!model``, ``!mode``.

Commands are handled the moment they arrive, even during a run, and never
become part of a batch.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from bridge.config import PERMISSION_MODES, RoomSettings
from bridge.core.duration import format_duration
from bridge.core.model import Batch, Message, MessageId, RoomKey, RunId, UserId
from bridge.core.text import safe_text
from bridge.core.transport import ApprovalChoice
from bridge.host.worktrees import Worktree, Worktrees, worktree_of
from bridge.inbound.history import RoomHistory
from bridge.live.approval_desk import ApprovalDesk, DeskStore
from bridge.live.approval_text import code_span, parse_input, status_line
from bridge.live.approvals import Verdict, refusal
from bridge.live.controls import LiveControls
from bridge.live.questions import (
    ASK,
    INTERACTIVE,
    PLAN,
    AnswerError,
    questions,
    read_answers,
)
from bridge.live.rule_commands import RuleCommands
from bridge.runs.worktree_lifetime import Lifetimes, listing
from bridge.store.base import (
    AuditAction,
    AuditEntry,
    AuditStore,
    RoomStore,
    RunRecord,
    StoreError,
)
from dispatcher import Dispatcher, RoomStatus, StopResult

log = logging.getLogger(__name__)


class CommandName(StrEnum):
    STOP = "stop"
    STATUS = "status"
    RESET = "reset"
    RETRY = "retry"
    APPROVE = "approve"
    DENY = "deny"
    RULES = "rules"
    MODEL = "model"
    MODE = "mode"
    SESSIONS = "sessions"
    RESUME = "resume"
    FORK = "fork"
    USAGE = "usage"
    WORKTREES = "worktrees"
    ANSWER = "answer"
    PLAN = "plan"
    HELP = "help"


_SUMMARY: dict[CommandName, str] = {
    CommandName.STOP: "stop the running run and drop the messages waiting for it",
    CommandName.STATUS: (
        "show the active run, waiting messages and tool requests, session, model and mode,"
        " last outcome"
    ),
    CommandName.RESET: "start a new Claude session with the next run",
    CommandName.RETRY: (
        "run the messages of the last failed or interrupted run again"
        " (`{p}retry RUN` names an earlier one; `{p}status` lists them)"
    ),
    CommandName.APPROVE: (
        "allow a tool request: `{p}approve #N`; `{p}approve session #N` also keeps a rule"
        " allowing the same use in this Claude session (until `{p}reset`), `{p}approve always"
        " #N` in this room (until revoked); without `#N` the oldest waiting one (approvers);"
        " a plan: `{p}approve #N` (edits asked one by one) or `{p}approve edits #N`"
        " (edits accepted)"
    ),
    CommandName.DENY: (
        "deny a tool request: `{p}deny #N reason` (reason and `#N` optional);"
        " `{p}deny always #N reason` also keeps a rule denying the same use in this room;"
        " a plan: `{p}deny #N feedback` keeps claude planning"
    ),
    CommandName.RULES: (
        "list the tool rules that hold here; `{p}rules revoke N` ends one,"
        " `{p}rules allow RULE` / `{p}rules deny RULE` keep one for the room, e.g."
        " `Bash(npm test:*)` (approvers)"
    ),
    CommandName.ANSWER: (
        "answer claude's question: `{p}answer #N 2` (an option), `{p}answer #N 1,3`"
        " (several), `{p}answer #N your words`; `;` between the answers to several questions"
    ),
    CommandName.MODEL: (
        "show the model of this room's runs; `{p}model NAME` sets it, for the running run"
        " from its next step and for the next runs, `{p}model reset` goes back to the"
        " configured one (approvers)"
    ),
    CommandName.MODE: (
        "show the permission mode of this room's runs; `{p}mode MODE` sets it like"
        f" `{{p}}model` ({', '.join(PERMISSION_MODES)}; `{{p}}mode reset`; approvers)"
    ),
    CommandName.SESSIONS: "list this conversation's recent Claude sessions",
    CommandName.RESUME: "`{p}resume N`: the next run continues session N of `{p}sessions`",
    CommandName.FORK: (
        "the next run starts from a copy of the current session, which stays as it is"
    ),
    CommandName.USAGE: "today's spending of this room and of the service, and the costliest runs",
    CommandName.WORKTREES: (
        "list this room's thread worktrees (`worktree = true`); `{p}worktrees prune` removes"
        " those no run works in, keeping their work on their branches (approvers)"
    ),
    CommandName.PLAN: (
        "the next runs start in permission mode `plan`: claude proposes a plan for the room"
        " to approve before it edits anything (`{p}mode reset` ends it; approvers)"
    ),
    CommandName.HELP: "list the commands",
}

REASON_LIMIT = 500
"""Characters of a denial reason kept (it goes to claude and the audit)."""

_NUMBER = re.compile(r"#([0-9]+)")
RESET_WORD = "reset"
"""``!model reset`` / ``!mode reset``: drop the room's override (not a model or mode name)."""
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@\[\]-]{0,199}")
"""Aliases (``opus``, ``sonnet[1m]``), full names, Bedrock/Vertex ids and ARNs; never a flag."""


@dataclass(frozen=True, slots=True)
class Command:
    name: CommandName | None
    """None for an unknown command word."""
    word: str
    argument: str = ""
    """The first word after the command (``!retry RUN``), if any."""
    rest: str = ""
    """Everything after the command word, as written (``!deny #3 too risky``)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What ``!approve`` / ``!deny`` asked: which request (None: the oldest), how, why."""

    choice: ApprovalChoice
    number: int | None
    reason: str = ""
    for_room: bool = False
    """``always``: keep the answer as a rule of the room."""
    edits: bool = False
    """``edits``: a plan started with edits accepted (said of anything but a plan, refused)."""
    cut: bool = False
    """The reason was longer than ``REASON_LIMIT`` and is cut (refused for a plan's feedback)."""


ALWAYS_WORD = "always"
"""``!approve always`` / ``!deny always``: the answer becomes a rule of the room."""


def parse_decision(command: Command) -> Decision | None:
    """The answer in an ``!approve`` or ``!deny`` command; None when it is malformed.

    Ids start with ``#``: ``!deny 3 tries is enough`` denies the oldest
    request with that reason, never request 3. ``!deny`` takes ``always``
    as its first word; ``!approve`` takes only one of ``session`` and
    ``always``, and an id, in either order.
    """
    if command.name is CommandName.DENY:
        first, *after = command.rest.split(maxsplit=1) or [""]
        for_room = first.lower() == ALWAYS_WORD
        rest = " ".join(after) if for_room else command.rest
        first, *after = rest.split(maxsplit=1) or [""]
        if first.startswith("#"):
            match = _NUMBER.fullmatch(first)
            if match is None:
                return None
            reason = _reason(" ".join(after))
            cut = reason != _reason(" ".join(after), None)
            return Decision(ApprovalChoice.DENY, int(match[1]), reason, for_room, cut=cut)
        cut = _reason(rest) != _reason(rest, None)
        return Decision(ApprovalChoice.DENY, None, _reason(rest), for_room, cut=cut)
    if command.name is not CommandName.APPROVE:
        return None
    number: int | None = None
    scope = ""
    for word in command.rest.split():
        match = _NUMBER.fullmatch(word)
        # "edits": a plan started with edits accepted (the session-wide choice).
        if word.lower() in ("session", "edits", ALWAYS_WORD) and not scope:
            scope = "session" if word.lower() == "edits" else word.lower()
        elif match is not None and number is None:
            number = int(match[1])
        else:
            return None
    if scope == "session":
        edits = "edits" in command.rest.lower().split()
        return Decision(ApprovalChoice.ALLOW_SESSION, number, edits=edits)
    return Decision(ApprovalChoice.ALLOW, number, for_room=scope == ALWAYS_WORD)


def _reason(text: str, limit: int | None = REASON_LIMIT) -> str:
    reason = " ".join(safe_text(text).split())
    return reason if limit is None or len(reason) <= limit else reason[: limit - 1] + "…"


def parse_command(text: str, prefix: str) -> Command | None:
    """The command in ``text``, or None if it is an ordinary message.

    A command is the prefix directly followed by a word, alone on the message;
    the next word is its argument, further words are ignored. ``"! hello"``
    and ``"!!"`` are messages.
    """
    stripped = text.strip()
    if not stripped.startswith(prefix):
        return None
    words = stripped[len(prefix) :].split(maxsplit=2)
    word = words[0] if words else ""
    if not word or not word[0].isalpha() or stripped[len(prefix)].isspace():
        return None
    argument = words[1] if len(words) > 1 else ""
    rest = stripped[len(prefix) + len(word) :].strip()
    word = word.lower()
    try:
        return Command(CommandName(word), word, argument, rest)
    except ValueError:
        return Command(None, word, argument, rest)


def help_text(prefix: str) -> str:
    lines = ["Commands:"]
    lines += [
        f"- `{prefix}{name}`: {summary.format(p=prefix)}" for name, summary in _SUMMARY.items()
    ]
    lines.append("Anything else from an allowed user goes to Claude.")
    return "\n".join(lines)


_ROOM_WIDE = frozenset({CommandName.STOP, CommandName.STATUS})
"""Commands that act on every thread when written at a thread room's top level."""


def thread_line(thread: str, status: RoomStatus) -> str:
    """One thread conversation in a room-wide ``!status``."""
    if status.running is not None:
        doing = "stopping" if status.stopping else "running"
    elif status.waiting_for_slot:
        doing = "waiting for a run slot"
    else:
        doing = "gathering messages"
    return f"Thread `{thread}`: {doing}; {_plural(status.waiting, 'message')} waiting."


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _run_size(messages: int, steered: int) -> str:
    """A run's messages: its batch and those steered into it."""
    size = _plural(messages, "message")
    return f"{size} + {steered} steered in" if steered else size


Answer = Callable[[Message, str], Awaitable[None]]
"""Says something in answer to a command message."""


class RoomWideElsewhere(Protocol):
    """A room's threads run by other replicas, for top-level ``!stop`` and ``!status``."""

    async def threads(self, room: RoomKey) -> list[str]:
        """One line per thread of ``room`` another replica owns, or that waits for a
        run slot owned by none."""
        ...

    async def stop(self, room: RoomKey, actor: UserId, before: MessageId) -> int | None:
        """Drop the messages of ``room``'s threads that wait owned by no replica
        (accepted before message ``before``) and ask every other replica to stop
        ``room``'s threads it runs: how many were dropped, None if that failed."""
        ...


class CommandStore(DeskStore, RoomStore, AuditStore, Protocol):
    """The store's roles :class:`CommandHandler` uses (and the desk and rules it makes)."""


@dataclass(slots=True)
class CommandHandler:
    """Carries out commands against the dispatcher and the store."""

    dispatcher: Dispatcher
    store: CommandStore
    prefix: str
    answer: Answer
    reset_session: Callable[[RoomKey], Awaitable[None]]
    """Forgets the room's Claude session, so that not even an active run restores it."""
    wall_clock: Callable[[], float] = time.time
    rooms: Callable[[RoomKey], RoomSettings | None] = lambda _room: None
    """The room's settings (approvers, the configured model and mode)."""
    live: LiveControls | None = None
    """The live runs; None until the bridge wires them: requests cannot be answered then."""
    refused: Callable[[Verdict], None] = lambda _verdict: None
    """Counts an answer or command refused for want of approval rights."""
    dropped: Callable[[Sequence[Message]], None] = lambda _messages: None
    """Shows that messages a stop dropped will get no answer (once the drop is recorded)."""
    worktrees: Worktrees | None = None
    """Thread conversations' worktrees: shown by ``!status``, removed by ``!reset``."""
    lifetimes: Lifetimes | None = None
    """Lists and prunes a room's worktrees (``!worktrees``)."""
    automation: Callable[[RoomKey], list[str]] = lambda _room: []
    """The room's schedules and webhooks, for the end of ``!status``
    (bridge/automation/schedules.py,
    bridge/automation/webhooks.py)."""
    status_parts: Sequence[Callable[[RoomKey], Awaitable[list[str]]]] = ()
    """More of ``!status``'s lines, in order: today's spending and the budgets
    (:mod:`bridge.runs.budget`), retries waiting for a usage limit (:mod:`bridge.runs.usage`)."""
    elsewhere: RoomWideElsewhere | None = None
    """With replicas: the threads of a room that other replicas run (docs/replicas.md)."""
    history: RoomHistory | None = None
    """``!sessions``, ``!resume``, ``!fork``, ``!usage``."""
    call_off_retries: Callable[[RoomKey], Awaitable[list[RunId]]] | None = None
    """Calls off the room's retries waiting for a usage limit to reset, for ``!stop`` and
    ``!reset`` (:meth:`bridge.runs.usage.LimitResumes.call_off`); the runs they were of."""

    async def _called_off(self, room: RoomKey) -> str:
        """Call off the room's waiting retries; what the command's answer adds about them."""
        if self.call_off_retries is None:
            return ""
        try:
            runs = await self.call_off_retries(room)
        except StoreError:
            log.exception("could not call off the retries after the usage limit")
            return " Could not call off the retry after the usage limit: the database failed."
        if not runs:
            return ""
        named = ", ".join(f"`{run}`" for run in runs)
        return (
            f" Called off the retry after the usage limit of run {named}"
            f" (`{self.prefix}retry RUN` still runs it)."
        )

    def _worktree(self, room: RoomKey) -> Worktree | None:
        settings = self.rooms(room)
        return None if settings is None else worktree_of(room, settings)

    async def _end_worktree(self, room: RoomKey) -> str:
        """After ``!reset``: the conversation's worktree goes, unless that would lose work."""
        tree = self._worktree(room)
        if tree is None or self.worktrees is None:
            return ""
        if self.dispatcher.status(room).running is not None:
            return "The thread's worktree stays while a run works in it."
        return await self.worktrees.remove(tree)

    def _worktree_lines(self, room: RoomKey) -> list[str]:
        tree = self._worktree(room)
        if tree is None:
            return []
        if not (tree.path / ".git").exists():
            return [f"Worktree: made on the first run, on branch `{tree.branch}`."]
        return [f"Worktree: `{tree.path}` on branch `{tree.branch}`."]

    async def handle(self, command: Command, message: Message) -> None:
        room = message.room
        if command.name in _ROOM_WIDE and self._opens_thread(message):
            await self._room_wide(command, message)
            return
        if command.name is CommandName.STOP:
            # Cancelling a run needs no write, so nothing that can fail comes
            # before it: not even the audit row ("database is locked").
            before = self.dispatcher.status(room)
            result = self.dispatcher.stop(room)
            await self._audit_command(command, message)
            called_off = await self._called_off(room)
            await self._stopped(message, before.stopping, result, before.steered, called_off)
            return
        await self._audit_command(command, message)
        match command.name:
            case CommandName.STATUS:
                await self._status(message)
            case CommandName.RESET:
                await self.reset_session(room)
                await self._audited(message, AuditAction.SESSION_RESET)
                text = "The next run starts a new Claude session."
                note = await self._end_worktree(room)
                called_off = await self._called_off(room)
                await self.answer(message, (f"{text} {note}" if note else text) + called_off)
            case CommandName.RETRY:
                await self._retry(message, command.argument)
            case CommandName.APPROVE | CommandName.DENY:
                await self._decide(command, message)
            case CommandName.RULES:
                rules = RuleCommands(
                    self.store,
                    self.prefix,
                    self.answer,
                    self._approver,
                    self.live,
                    self.wall_clock,
                )
                await rules.handle(message, command.rest)
            case CommandName.ANSWER:
                await self._answer_question(command, message)
            case CommandName.MODEL:
                await self._model(message, command.rest)
            case CommandName.MODE:
                await self._mode(message, command.rest)
            case CommandName.SESSIONS | CommandName.RESUME | CommandName.FORK | CommandName.USAGE:
                await self._history(command, message)
            case CommandName.WORKTREES:
                await self._worktrees(message, command.argument)
            case CommandName.PLAN:
                await self._mode(message, "plan")
            case CommandName.HELP:
                await self.answer(message, help_text(self.prefix))
            case None:
                await self.answer(
                    message,
                    f"Unknown command `{self.prefix}{command.word}`; try `{self.prefix}help`.",
                )

    async def _history(self, command: Command, message: Message) -> None:
        if self.history is None:
            await self.answer(message, "Not available here.")
            return
        match command.name:
            case CommandName.SESSIONS:
                await self.history.list_sessions(message)
            case CommandName.RESUME:
                await self.history.resume(message, command.argument)
            case CommandName.FORK:
                await self.history.fork(message)
            case _:
                await self.history.usage(message)

    async def _worktrees(self, message: Message, argument: str) -> None:
        """``!worktrees``: the room's thread worktrees; ``!worktrees prune`` (approvers):
        retire every one no run works in."""
        room = message.room.channel
        settings = self.rooms(room)
        if settings is None or not settings.worktree or self.lifetimes is None:
            await self.answer(message, "This room gives threads no worktrees (`worktree`).")
            return
        if argument.lower() != "prune":
            await self.answer(message, listing(await self.lifetimes.found(room, settings)))
            return
        if not await self._approver(message):
            return
        count = await self.lifetimes.prune(
            room, settings, 0.0, f"pruned by {self.prefix}worktrees prune"
        )
        await self.answer(
            message,
            f"Pruned {_plural(count, 'worktree')} no run works in; each thread was told"
            " where its work is.",
        )

    def _opens_thread(self, message: Message) -> bool:
        """``message`` is top-level in a room of thread conversations (so it opened
        a conversation of its own, which has nothing to stop or show)."""
        settings = self.rooms(message.room)
        return (
            settings is not None
            and settings.conversation == "thread"
            # (Not the key's thread: an overlong one is a digest there.)
            and message.thread == message.external_id
        )

    async def _room_wide(self, command: Command, message: Message) -> None:
        """``!stop`` / ``!status`` written at the top level of a room of thread
        conversations: for every thread of the room."""
        threads = [k for k in self.dispatcher.conversations(message.room) if k != message.room]
        elsewhere = self.elsewhere
        if command.name is CommandName.STATUS:
            await self._audit_command(command, message)
            lines = [thread_line(key.thread, self.dispatcher.status(key)) for key in threads]
            if elsewhere is not None:
                lines += await elsewhere.threads(message.room)
            await self.answer(message, "\n".join(lines) or "No thread of this room has work.")
            return
        unowned: int | None = 0
        if elsewhere is not None:
            unowned = await elsewhere.stop(message.room, message.sender, message.id)
        runs, dropped, recorded = await self.stop_threads(message.room, message.sender)
        if not recorded or unowned is None:
            # What could not be dropped waits on: those of this replica's threads
            # (counted), or those waiting unowned (not counted: none was read).
            await self._stop_failed(message, runs > 0, len(dropped) if not recorded else 0)
            return
        await self._audit_command(command, message)
        if not runs and not dropped and not unowned:
            more = " here" if elsewhere is not None else ""
            await self.answer(
                message, f"Nothing is running or waiting in this room's threads{more}."
            )
            return
        await self.answer(
            message,
            f"Stopping {_plural(runs, 'run')} in this room's threads;"
            f" dropped {_plural(len(dropped) + unowned, 'waiting message')}.",
        )

    async def stop_threads(
        self, room: RoomKey, actor: UserId, *, before: MessageId | None = None
    ) -> tuple[int, list[Message], bool]:
        """Stop every thread of ``room`` this process runs: runs stopped, messages
        dropped, and False if the drop could not be recorded (they wait again).

        ``before``: only what came before that message (a ``!stop`` heard late
        from another replica): a run with none of it goes on, later messages
        stay queued. (Message ids follow the shared inbox's order of receipt.)
        """
        threads = [k for k in self.dispatcher.conversations(room) if k != room]
        # As a stop in one conversation: cancel first, then write.
        stopped: list[tuple[RoomKey, Batch | None, tuple[Message, ...]]] = []
        for key in threads:
            if before is not None:
                running = self.dispatcher.status(key).running
                if running is not None and all(m.id >= before for m in running.messages):
                    # Its run began after the stop, and what waits behind it came later.
                    continue
            result = self.dispatcher.stop(key)
            gone = result.dropped
            if before is not None:
                # What came after the stop queues again, in order.
                self.dispatcher.restore(key, tuple(m for m in gone if m.id >= before))
                gone = tuple(m for m in gone if m.id < before)
            stopped.append((key, result.stopped, gone))
        dropped = [m for _, _, gone in stopped for m in gone]
        runs = sum(run is not None for _, run, _ in stopped)
        if dropped:
            try:
                await self.store.mark_dropped([m.id for m in dropped], actor, self.wall_clock())
            except StoreError:
                log.exception("could not record the dropped messages")
                for key, _, gone in stopped:
                    self.dispatcher.restore(key, gone)
                return runs, dropped, False
            self.dropped(dropped)
        return runs, dropped, True

    async def _audit_command(self, command: Command, message: Message) -> None:
        """The command's audit row, best effort: a failed audit write never blocks a command.

        Not retried: the sink must not wait, and SQLite already waits out a
        lock (``busy_timeout``) before failing; the log keeps the trace.
        """
        try:
            await self._audited(message, AuditAction.COMMAND, command.word)
        except StoreError:
            log.exception("could not audit command %s from %s", command.word, message.sender)

    async def _stopped(
        self,
        message: Message,
        stopping: bool,
        result: StopResult,
        steered: int = 0,
        called_off: str = "",
    ) -> None:
        """Record the stop the dispatcher just made; the drop holds only once it is recorded.

        The dispatcher took the waiting messages out at once, so none can
        start while the drop is written. If the write fails they go back in
        front of the queue (order kept), stay pending in the store, and the
        room is told: memory and store never disagree, so nothing dropped
        runs after a restart and nothing kept is lost. Cancelling the run
        needs no write here (the run records its own end).
        """
        room = message.room
        now = self.wall_clock()
        if result.dropped:
            try:
                await self.store.mark_dropped([m.id for m in result.dropped], message.sender, now)
            except StoreError:
                log.exception("could not record the dropped messages")
                self.dispatcher.restore(room, result.dropped)
                await self._stop_failed(message, result.stopped is not None, len(result.dropped))
                return
            self.dropped(result.dropped)
        try:
            await self._audited(
                message,
                AuditAction.STOP_REQUESTED,
                f"running={result.stopped is not None} dropped={len(result.dropped)}",
                at=now,
            )
        except StoreError:
            # The stop itself is recorded (drops, the run's end): only the audit row is missing.
            log.exception("could not audit the stop")
        dropped = _plural(len(result.dropped), "waiting message")
        if result.stopped is not None:
            size = _run_size(len(result.stopped.messages), steered)
            text = f"Stopping the run of {size}; dropped {dropped}."
        elif stopping:
            text = f"The run is already stopping; dropped {dropped}."
        elif result.dropped:
            text = f"Nothing was running; dropped {dropped}."
        else:
            text = "Nothing is running and nothing is waiting."
        await self.answer(message, text + called_off)

    async def _stop_failed(self, message: Message, running: bool, waiting: int) -> None:
        kept = _plural(waiting, "waiting message") if waiting else "waiting messages"
        text = f"Could not drop the {kept}: the database failed. They stay queued and will run"
        if running:
            text = f"Stopping the run. {text} after it"
        await self.answer(message, f"{text}; `{self.prefix}stop` again to drop them.")

    async def _status(self, message: Message) -> None:
        room = message.room
        status = self.dispatcher.status(room)
        now = self.wall_clock()
        lines = []
        last = await self.store.last_run(room)
        if status.running is not None:
            size = _run_size(len(status.running.messages), status.steered)
        if status.running is not None and status.stopping:
            run = f", run `{last.id}`" if last is not None and last.report is None else ""
            lines.append(f"Stopping ({size}{run}).")
        elif status.running is not None and last is not None and last.report is None:
            lines.append(
                f"Running for {format_duration(now - last.started_at)} ({size}, run `{last.id}`)."
            )
        elif status.running is not None:
            lines.append(f"Running ({size}).")
        else:
            lines.append("Idle.")
        if status.reclaiming is not None:
            lines.append(
                "It was answered and goes on when a run slot frees"
                f" ({_plural(status.reclaiming, 'waiting run')} ahead)."
            )
        elif status.lent:
            lines.append("It waits for a person; its run slot serves other rooms meanwhile.")
        lines.append(f"Waiting: {_plural(status.waiting, 'message')}.")
        session = await self.store.get_session(room)
        lines.append(
            f"Session: `{session}`." if session else "Session: none (next run starts fresh)."
        )
        if last is not None and last.report is not None:
            report = last.report
            parts = [f"Last run: {report.status.value}"]
            if last.ended_at is not None:
                parts.append(f"took {format_duration(last.ended_at - last.started_at)}")
            if report.cost_usd is not None:
                parts.append(f"cost ${report.cost_usd:.4f}")
            lines.append(", ".join(parts) + ".")
        lines += await self._model_lines(room)
        lines += self._worktree_lines(room)
        for part in self.status_parts:
            lines += await part(room)
        lines += self._retryable_lines(await self.store.retryable_runs(room), now)
        pending = await self.store.pending_approvals(room)
        if pending:
            lines.append(
                f"Tool requests waiting (`{self.prefix}approve #N`, `{self.prefix}deny #N`):"
            )
            lines += [status_line(a, now) for a in pending]
        lines += self.automation(room)
        await self.answer(message, "\n".join(lines))

    async def _model_lines(self, room: RoomKey) -> list[str]:
        overrides = await self.store.room_overrides(room)
        settings = self.rooms(room)
        lines = []
        for what, chosen, configured in (
            ("Model", overrides.model, settings.model if settings else ""),
            ("Mode", overrides.permission_mode, settings.permission_mode if settings else ""),
        ):
            if chosen is not None:
                lines.append(f"{what}: {code_span(chosen)} (set by command).")
            elif configured:
                lines.append(f"{what}: {code_span(configured)}.")
            else:
                lines.append(f"{what}: claude's default.")
        return lines

    # Live runs

    async def _approver(self, message: Message, changing: str = "") -> bool:
        """Whether the sender is one of the room's approvers; if not, it is counted, and
        an allowed user is told why (anyone else hears nothing). ``changing``: the
        command refused is ``!model`` or ``!mode`` (not an answer to a tool request)."""
        settings = self.rooms(message.room)
        if settings is not None and settings.approves(message.sender):
            return True
        verdict = Verdict.STRANGER
        if settings is not None and settings.allows(message.sender):
            verdict = Verdict.NOT_APPROVER
        self.refused(verdict)
        text = refusal(verdict)
        if text is not None and changing:
            text = (
                f"Only approvers may change the {changing} in this room with"
                f" `{self.prefix}{changing}` (you are not an approver)."
            )
        if text is not None:
            await self.answer(message, text)
        return False

    async def _decide(self, command: Command, message: Message) -> None:
        """``!approve`` / ``!deny``: judged, recorded once, then handed to the run."""
        decision = parse_decision(command)
        if not await self._may_decide(message, decision):
            return
        if decision is None:
            p = self.prefix
            await self.answer(
                message,
                f"Say `{p}approve #N`, `{p}approve session #N`, `{p}approve always #N`,"
                f" `{p}deny #N reason` or `{p}deny always #N reason`"
                " (ids start with `#`; without one, the oldest waiting request).",
            )
            return
        if self.live is None:
            await self.answer(message, "Tool requests cannot be answered: no live runs here.")
            return
        room = message.room
        if decision.number is None:
            pending = await self.store.pending_approvals(room)
            if decision.edits:
                pending = [a for a in pending if a.tool_name == PLAN]
            if not pending:
                what = "plan" if decision.edits else "tool request"
                await self.answer(message, f"No {what} is waiting.")
                return
            approval = pending[0]
        else:
            found = await self.store.approval_by_number(room, decision.number)
            if found is None:
                await self.answer(message, f"There is no request `#{decision.number}` here.")
                return
            approval = found
        if decision.cut and approval.tool_name in INTERACTIVE:
            # claude reads it as the person's words: never less than they wrote.
            await self.answer(
                message,
                f"Feedback is kept up to {REASON_LIMIT} characters: say it shorter"
                f" (`#{approval.number}` still waits).",
            )
            return
        if decision.edits and approval.tool_name != PLAN:
            # Never an allow for the session of a tool use typed as a plan's start.
            number = f"#{approval.number}"
            await self.answer(
                message,
                f"`{self.prefix}approve edits` starts a plan with edits accepted: request"
                f" `{number}` is not a plan. Say `{self.prefix}approve {number}` or"
                f" `{self.prefix}approve session {number}`.",
            )
            return
        desk = ApprovalDesk(self.store, self.rooms, self.live, self.refused, self.wall_clock)
        answered = await desk.take(
            message.sender,
            approval,
            decision.choice,
            decision.reason,
            for_room=decision.for_room,
        )
        if answered.text is not None:
            await self.answer(message, answered.text)

    async def _may_decide(self, message: Message, decision: Decision | None) -> bool:
        """Whether the sender may go on with ``!approve`` / ``!deny``: an approver, or anyone
        declining a question by its id (the desk judges them as it judges ``!answer``)."""
        settings = self.rooms(message.room)
        if settings is not None and settings.approves(message.sender):
            return True
        if decision is not None and decision.choice is ApprovalChoice.DENY and decision.number:
            found = await self.store.approval_by_number(message.room, decision.number)
            if found is not None and found.tool_name == ASK:
                return True
        return await self._approver(message)

    async def _answer_question(self, command: Command, message: Message) -> None:
        """``!answer #N reply``: claude's question answered (by its run's senders or an
        approver; the desk judges), the reply read against its options first."""
        first, *after = command.rest.split(maxsplit=1) or [""]
        match = _NUMBER.fullmatch(first)
        number = int(match[1]) if match is not None else None
        # After an id, the rest is the answer, if any: never the id itself.
        reply = command.rest if match is None else "".join(after)
        if self.live is None:
            await self.answer(message, "Questions cannot be answered: no live runs here.")
            return
        room = message.room
        if number is None:
            waiting = [a for a in await self.store.pending_approvals(room) if a.tool_name == ASK]
            found = waiting[0] if waiting else None
        else:
            found = await self.store.approval_by_number(room, number)
        if found is None or found.tool_name != ASK:
            await self.answer(message, "No question of claude's is waiting as that.")
            return
        try:
            kept = read_answers(questions(parse_input(found.input_json)), safe_text(reply))
        except AnswerError as exc:
            await self.answer(message, str(exc))
            return
        desk = ApprovalDesk(self.store, self.rooms, self.live, self.refused, self.wall_clock)
        answered = await desk.take(message.sender, found, ApprovalChoice.ALLOW, kept)
        if answered.text is not None:
            await self.answer(message, answered.text)

    async def _model(self, message: Message, name: str) -> None:
        if not await self._overriding(message, "model", name):
            return
        if _MODEL_NAME.fullmatch(name) is None:
            await self.answer(message, f"{code_span(name)} is not a model name.")
            return
        text = f"This room's runs use model {code_span(name)} from now on."
        await self._keep_override(message, "model", name, name, text)

    async def _mode(self, message: Message, mode: str) -> None:
        if not await self._overriding(message, "mode", mode):
            return
        known = {m.lower(): m for m in PERMISSION_MODES}
        canonical = known.get(mode.lower())
        if canonical is None:
            await self.answer(
                message,
                f"{code_span(mode)} is not a permission mode: {', '.join(PERMISSION_MODES)}.",
            )
            return
        text = f"This room's runs use permission mode `{canonical}` from now on."
        await self._keep_override(message, "mode", canonical, canonical, text)

    async def _overriding(self, message: Message, what: str, value: str) -> bool:
        """What ``!model`` and ``!mode`` do first: with no value, show the room's; then only
        an approver goes on, and ``reset`` goes back to the configured one. True when
        ``value`` is still to be checked and set."""
        if not value:
            shown = await self._model_lines(message.room)
            await self.answer(message, shown[0] if what == "model" else shown[1])
            return False
        if not await self._approver(message, what):
            return False
        if value.lower() == RESET_WORD:
            await self._reset_override(message, what)
            return False
        return True

    async def _reset_override(self, message: Message, what: str) -> None:
        """``!model reset`` / ``!mode reset``: back to the room's configured value."""
        settings = self.rooms(message.room)
        if what == "model":
            configured = settings.model if settings else ""
            shown = code_span(configured) if configured else "claude's default"
            text = f"This room's runs use the configured model ({shown}) from now on."
            # An empty model asks claude for its default.
            await self._keep_override(message, what, None, configured, text)
        else:
            mode = (settings.permission_mode if settings else "") or "default"
            text = f"This room's runs use the configured permission mode (`{mode}`) from now on."
            await self._keep_override(message, what, None, mode, text)

    async def _keep_override(
        self, message: Message, what: str, kept: str | None, applied: str, text: str
    ) -> None:
        """Keep ``kept`` as the room's model or mode (None: the configured one again),
        audit it, switch the room's running run to ``applied``, and answer ``text``."""
        room = message.room
        model = what == "model"
        await (self.store.set_room_model if model else self.store.set_room_mode)(room, kept)
        key = "model" if model else "permission_mode"
        await self._audited(
            message,
            AuditAction.ROOM_OVERRIDE_SET,
            f"{key}={'(configured)' if kept is None else kept}",
        )
        note = ""
        if self.live is not None:
            note = await (self.live.set_model if model else self.live.set_mode)(room, applied)
        await self.answer(message, f"{text} {note}".rstrip())

    async def _audited(
        self,
        message: Message,
        action: AuditAction,
        detail: str = "",
        *,
        at: float | None = None,
        run_id: RunId | None = None,
    ) -> None:
        """The audit row of what ``message`` asked, in its room (at ``at``, or now)."""
        when = self.wall_clock() if at is None else at
        await self.store.audit(
            AuditEntry.asked(message, action, when, run_id=run_id, detail=detail)
        )

    def _retryable_lines(self, runs: list[RunRecord], now: float) -> list[str]:
        if not runs:
            return []
        lines = [f"Can be retried (`{self.prefix}retry RUN`; the latest without RUN):"]
        for run in reversed(runs):
            ended = run.ended_at if run.ended_at is not None else run.started_at
            lines.append(
                f"- run `{run.id}`: {run.status.value} {format_duration(now - ended)} ago, "
                f"{_plural(len(run.message_ids), 'message')}"
            )
        return lines

    async def _retry(self, message: Message, run_id: str) -> None:
        """Queue again the messages of an offered run: the latest, or the one named.

        The messages are submitted like new ones: behind an active run they
        become its follow-up batch. The store re-queues a run's failed
        messages only once, so a second ``!retry`` cannot queue them twice.
        """
        room = message.room
        offered = await self.store.retryable_runs(room)
        if run_id:
            run = next((r for r in offered if r.id == run_id), None)
            if run is None:
                await self.answer(
                    message,
                    f"Run `{run_id}` cannot be retried here: it is not a failed or "
                    f"interrupted run of this room still waiting for a retry "
                    f"(`{self.prefix}status` lists them).",
                )
                return
        elif offered:
            run = offered[-1]
        else:
            await self.answer(message, "There is no failed or interrupted run to retry.")
            return
        messages = await self.store.requeue_run(run.id)
        if not messages:
            # Another retry of the same run got there first.
            await self.answer(message, f"Run `{run.id}` is already being retried.")
            return
        # Pending in the store now: into the queue before anything else can fail.
        for queued in messages:
            self.dispatcher.submit(queued)
        await self._audited(
            message, AuditAction.RETRY_REQUESTED, f"messages={len(messages)}", run_id=run.id
        )
        await self.answer(
            message, f"Retrying {_plural(len(messages), 'message')} of run `{run.id}`."
        )

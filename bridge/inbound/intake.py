"""The path of an inbound message: authorize, record, then command or dispatch.

A message is committed to the store before anything else happens to it, so
the transport may acknowledge it upstream as soon as :meth:`Intake.accept`
returns, and a crash after that point loses nothing.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from bridge.config import RoomSettings, Settings
from bridge.core import stages
from bridge.core.model import ExternalMessageId, InboundMessage, Message, MessageId, RoomKey
from bridge.core.synthetic import is_synthetic
from bridge.core.text import safe_text
from bridge.core.transport import (
    Accepted,
    ApprovalAction,
    InboundEvent,
    MessageDeleted,
    MessageEdited,
    Typing,
)
from bridge.host.logs import log_context
from bridge.inbound.commands import Command, CommandHandler, CommandName, parse_command
from bridge.inbound.room_order import RoomOrder, Turn
from bridge.metrics import Metrics
from bridge.store.base import MessageStore, RoomStore, StoreError
from dispatcher import Dispatcher, RoomStatus

log = logging.getLogger(__name__)

_ANSWERS = frozenset({CommandName.APPROVE, CommandName.DENY, CommandName.ANSWER, CommandName.RULES})
"""The commands of approvers who are not allowed users: answers to tool requests and to
claude's questions and plans, and the rules those answers keep (`!rules`)."""


def conversation_of(inbound: InboundMessage, room: RoomSettings) -> InboundMessage:
    """``inbound`` in the conversation it belongs to.

    In a room of thread conversations, a message in a thread belongs to that
    thread's, and a top-level message opens a thread of its own: its answers
    go there, and replies to it join its conversation.
    """
    if room.conversation != "thread" or is_synthetic(inbound):
        # A schedule's or webhook's message has no thread to open: it keeps the
        # room-wide conversation (so a schedule's firings share one session).
        return inbound
    thread = inbound.thread or inbound.external_id
    return replace(inbound, room=inbound.room.in_thread(thread), thread=thread)


class Placement(Protocol):
    """Where an accepted message is handled: here, or by the replica owning its
    conversation (docs/replicas.md)."""

    async def local(self, message: Message, *, needs_slot: bool) -> bool:
        """True: this process handles ``message``; False: it was handed to its owner.

        ``needs_slot``: it is for a run (a command is not), so a conversation
        nobody owns goes to a replica with a free run slot."""
        ...

    async def changed(self, message: Message, *, deleted: bool) -> None:
        """``message`` was edited (it reads as given) or deleted in the store: its
        conversation's owner, if another replica, updates its queue."""
        ...


class IntakeStore(MessageStore, RoomStore, Protocol):
    """The store's roles :class:`Intake` uses."""


@dataclass(slots=True)
class Intake:
    settings: Settings
    store: IntakeStore
    dispatcher: Dispatcher
    commands: CommandHandler
    metrics: Metrics
    on_accepted: Callable[[Message], None] = lambda message: None
    """Called for each message that will go to a run (shows it as received)."""
    on_withdrawn: Callable[[Message], None] = lambda message: None
    """Called for a deleted message that was the last waiting in its conversation, with
    no run going there (what showed it received ends: nothing will answer)."""
    on_approval_action: Callable[[ApprovalAction], Awaitable[Accepted]] | None = None
    """Decides a transport's approval action (a button, a reaction); None: not wired yet,
    each action is logged and ignored."""
    wall_clock: Callable[[], float] = time.time
    placement: Placement | None = None
    """With replicas: decides which one handles each accepted message (None: this one)."""
    _order: RoomOrder = field(default_factory=RoomOrder, init=False)
    _not_handed: Counter[tuple[RoomKey, ExternalMessageId]] = field(
        default_factory=Counter, init=False
    )
    """Messages being accepted, before their hand-over: called after any edit now acting."""
    _placing: set[MessageId] = field(default_factory=set, init=False)
    """Accepted messages whose placement is under way: it may wait for a takeover of
    their conversation, whose recovery then hands them over (see :meth:`recover`)."""
    _carried_out: set[MessageId] = field(default_factory=set, init=False)
    """Of those, commands that recovery carried out: their accept must not again."""

    async def accept(self, event: InboundEvent) -> Accepted:
        """The transports' sink. Returns once the event is durably recorded.

        Also while the service shuts down: the dispatcher then begins no run,
        so a message accepted now stays pending and runs after the restart.

        Calls may overlap (a transport hands a burst over at once): each
        records at once, but what it does then (queue, command, edit,
        deletion) happens in the order of the calls in its room, so it
        returns once that is done too (see :mod:`bridge.inbound.room_order`).
        """
        if isinstance(event, Typing):
            # Nothing to record or order: the windows of the room's batches hear it now.
            self.dispatcher.typing(event.room, event.users)
            return Accepted.IGNORED
        # Before the first wait: the turn follows the order of the calls.
        turn = self._order.take(event.room)
        try:
            with log_context(room=event.room):
                if isinstance(event, InboundMessage):
                    # Chat text is made storable here, once (a lone surrogate, NUL).
                    return await self._accept(replace(event, text=safe_text(event.text)), turn)
                if isinstance(event, MessageEdited):
                    event = replace(event, text=safe_text(event.text))
                # It acts on what the turns before it recorded and queued.
                await turn.wait()
                if isinstance(event, ApprovalAction):
                    return await self._approval(event)
                return await self._change(event)
        finally:
            turn.end()

    async def accept_synthetic(self, inbound: InboundMessage) -> Accepted:
        """A message no one wrote in chat (a schedule's firing, a webhook's delivery).

        The same path as a chat message (recorded first, duplicates by external id
        refused, then dispatched in the room's order) except that the room's
        allowlist and trigger do not apply, and its text is never a command.
        """
        turn = self._order.take(inbound.room)
        try:
            with log_context(room=inbound.room):
                synthetic = replace(inbound, text=safe_text(inbound.text))
                return await self._accept(synthetic, turn, synthetic=True)
        finally:
            turn.end()

    async def _change(self, event: MessageEdited | MessageDeleted) -> Accepted:
        """An edit or deletion: only of a message still waiting; nothing else starts.

        Persist, then act: the store changes the message only while it is
        pending (its condition decides a race with the run's start), then the
        dispatcher's queue follows. An edit that came before its original, or
        after the message went into a run, changes nothing. A command was
        carried out when it came, so editing or deleting one changes nothing,
        and an edit never turns a message into a command (nor runs one).
        """
        room = self.settings.room(event.room)
        if room is None:
            return self._ignored_change(event, "room not configured")
        message = await self.store.pending_message(event.room, event.external_id)
        if message is None:
            return self._ignored_change(event, "no such waiting message")
        if self._not_handed[event.room.channel, event.external_id]:
            # Called after this edit (which waits for every event called before
            # it): recorded already, maybe, but the edit still came first.
            return self._ignored_change(event, "came before the message")
        prefix = self.settings.commands.prefix
        if parse_command(message.text, prefix) is not None:
            return self._ignored_change(event, "a command")
        now = self.wall_clock()
        if isinstance(event, MessageDeleted):
            deleted = await self.store.delete_pending(message.id, event.sender, now)
            if deleted is None:
                return self._ignored_change(event, "went into a run meanwhile")
            if self.dispatcher.remove(deleted):
                left = self.dispatcher.status(deleted.room)
                if left.running is None and not left.waiting:
                    self.on_withdrawn(deleted)
            elif self.placement is not None:
                await self.placement.changed(deleted, deleted=True)
            self.metrics.messages.labels("deleted").inc()
            log.info("message %s was deleted before it ran", message.id)
            return Accepted.ACCEPTED
        # A deletion may come from a moderator (the platform checked their right
        # to delete); an edit only from the author, who must still be allowed.
        if event.sender is not None and (
            event.sender != message.sender or not room.allows(event.sender)
        ):
            return self._ignored_change(event, "not the author, or not allowed")
        if parse_command(event.text, prefix) is not None:
            return self._ignored_change(event, "an edit into a command")
        edited = await self.store.edit_pending(message.id, event.text, message.sender, now)
        if edited is None:
            return self._ignored_change(event, "unchanged, or went into a run meanwhile")
        if self.dispatcher.replace(edited):
            pass
        elif self.placement is not None:
            # Waiting on the replica that owns its conversation, if not here.
            await self.placement.changed(edited, deleted=False)
        else:
            # Taken into a run between the store's check and now: the run has
            # the text from before the edit (the store recorded the edit first).
            log.warning(
                "message %s was edited as its run began; the run has the old text", message.id
            )
        self.metrics.messages.labels("edited").inc()
        log.info("message %s was edited before it ran", message.id)
        return Accepted.ACCEPTED

    async def _approval(self, action: ApprovalAction) -> Accepted:
        """An answer to an approval request: the approvals handler decides (and authorizes)."""
        if self.settings.room(action.room) is None:
            log.debug("ignored an approval action in %s: room not configured", action.room)
            return Accepted.IGNORED
        if self.on_approval_action is None:
            log.info(
                "approval action %s by %s on %s: no approvals handler; ignored",
                action.choice,
                action.sender,
                action.message_id,
            )
            return Accepted.IGNORED
        return await self.on_approval_action(action)

    def _ignored_change(self, event: MessageEdited | MessageDeleted, reason: str) -> Accepted:
        kind = "an edit" if isinstance(event, MessageEdited) else "a deletion"
        log.debug("ignored %s of %s: %s", kind, event.external_id, reason)
        return Accepted.IGNORED

    async def _accept(
        self, inbound: InboundMessage, turn: Turn, *, synthetic: bool = False
    ) -> Accepted:
        room = self.settings.room(inbound.room)
        now = self.wall_clock()
        # The user's wait began when the message came: the window counts from here.
        arrived = self.dispatcher.now()
        reason = None
        if room is None:
            reason = "room not configured"
        elif inbound.sender_is_bot:
            reason = "sender is a bot"
        command = None if synthetic else parse_command(inbound.text, self.settings.commands.prefix)
        # A synthetic message was configured by the operator: no chat user to check.
        if (
            reason is None
            and room is not None
            and not synthetic
            and not room.allows(inbound.sender)
        ):
            # An approver need not be an allowed user (docs/live-runs.md: only approvers
            # answer): their answers count by command as by button or reaction.
            answering = command is not None and command.name in _ANSWERS
            if not (answering and room.approves(inbound.sender)):
                reason = "sender not allowed"
        if (
            reason is None
            and room is not None
            and room.trigger == "mention"
            and not inbound.mentions_bot
            and command is None
            and not await self._thread_goes_on(inbound, room)
        ):
            reason = "no mention"
        if reason is not None or room is None:
            self.metrics.messages.labels("ignored").inc()
            log.debug("ignored a message from %s: %s", inbound.sender, reason)
            if room is not None and reason is not None and reason != "sender is a bot":
                await self.store.record_ignored(inbound, reason, now)
            return Accepted.IGNORED

        inbound = conversation_of(inbound, room)
        key = (inbound.room.channel, inbound.external_id)
        self._not_handed[key] += 1
        try:
            # The record is the store's first call: concurrent accepts reach the
            # store in call order, and its group commit takes them together.
            message = await self.store.accept(inbound, now)
            stages.stamp("accepted")
            if message is None:
                self.metrics.messages.labels("duplicate").inc()
                log.debug("duplicate delivery of %s", inbound.external_id)
                return Accepted.DUPLICATE
            # Recorded; what follows waits for the events of the room called
            # before this one: after ``!retry`` its messages are queued first,
            # after ``!stop`` nothing of this message is dropped, after
            # ``!reset`` it runs in the new session.
            await turn.wait()
        finally:
            self._not_handed[key] -= 1
            if not self._not_handed[key]:
                del self._not_handed[key]
        placement = self.placement
        if placement is not None:
            self._placing.add(message.id)
            try:
                here = await placement.local(message, needs_slot=not command)
            finally:
                self._placing.discard(message.id)
                carried_out = message.id in self._carried_out
                self._carried_out.discard(message.id)
            if not here:
                # Recorded, and its conversation's owner was told: it handles it.
                self.metrics.messages.labels("forwarded").inc()
                return Accepted.ACCEPTED
            if carried_out:
                # Placing it took the conversation over (here or in the poll), and
                # the recovery, which read it pending, carried it out in its place.
                return Accepted.ACCEPTED
        await self._handle(command, message, arrived)
        return Accepted.ACCEPTED

    async def _handle(
        self, command: Command | None, message: Message, arrived: float | None = None
    ) -> None:
        """What an accepted message does here: a command, or a run's input (which
        ``arrived`` then, on the dispatcher's clock, if it is known)."""
        if command is not None:
            self.metrics.messages.labels("command").inc()
            # The room's next events wait for it: answers are only recorded
            # here (see bridge.outbound.notices), so that costs no network call.
            await self._command(command, message)
        elif not self.dispatcher.holds(message):
            self.metrics.messages.labels("accepted").inc()
            self.dispatcher.submit(message, arrived)
            self.on_accepted(message)

    async def take_forwarded(self, message: Message) -> None:
        """A message another replica accepted, for a conversation this one owns.

        Handled in the room's order, and only while it is still pending: a
        second notice of it (a notification and the poll) changes nothing.
        """
        turn = self._order.take(message.room)
        try:
            await turn.wait()
            with log_context(room=message.room):
                current = await self.store.pending_message(message.room, message.external_id)
                if current is None or current.id != message.id:
                    return
                prefix = self.settings.commands.prefix
                command = None if is_synthetic(current) else parse_command(current.text, prefix)
                await self._handle(command, current)
        finally:
            turn.end()

    async def _thread_goes_on(self, inbound: InboundMessage, room: RoomSettings) -> bool:
        """In a room of thread conversations, a reply in a thread the bot already
        converses in continues it without a mention (as one talks in a thread)."""
        if room.conversation != "thread" or inbound.thread is None:
            return False
        key = inbound.room.in_thread(inbound.thread)
        if self.dispatcher.status(key) != RoomStatus():
            return True
        return await self.store.get_session(key) is not None

    async def _command(self, command: Command, message: Message) -> None:
        try:
            await self.commands.handle(command, message)
        except StoreError:
            log.exception("command %s failed", command.word)
            await self.commands.answer(
                message, f"Could not carry out `{command.word}`: the database failed."
            )
        # Settled after handling: one left pending by a crash is settled,
        # not run, at the next start (see recover).
        await self.store.complete_command(message.id)

    async def recover(self, pending: list[Message], *, keep_commands: bool = False) -> int:
        """Re-enter messages accepted before a restart but never run, in order.

        Commands accepted just before a crash are settled, not run: agent
        runs and stops have effects, and a stale ``!stop`` must not hit a new run.
        With ``keep_commands`` (a replica taking a conversation over, or keeping
        it at its restart) they are carried out instead, here, in their place
        among the messages: there they are mostly commands another replica
        handed to an owner that had just died, and nobody else would answer
        them. Not left to the poll: the messages after a command would be
        queued first, and a ``!stop`` carried out later would drop them.

        No room turn is taken (:mod:`bridge.inbound.room_order`): the takeover may run
        inside an accept of the room, holding its turn, that waits for it. An
        accept of one of ``pending`` that waits for this takeover finds its
        message queued, or its command carried out, and does nothing more.
        """
        resumed = 0
        prefix = self.settings.commands.prefix
        for message in pending:
            if self.dispatcher.holds(message):
                continue  # handed over already (a replica's takeover and its own accept)
            command = None if is_synthetic(message) else parse_command(message.text, prefix)
            if command is not None and keep_commands:
                if message.id in self._placing:
                    self._carried_out.add(message.id)
                with log_context(room=message.room):
                    await self._handle(command, message)
                continue
            if command is not None or _empty(message):
                await self.store.complete_command(message.id)
            elif self.settings.room(message.room) is None:
                log.warning("pending message %s is for a room no longer configured", message.id)
            else:
                self.dispatcher.submit(message)
                resumed += 1
        return resumed


def _empty(message: Message) -> bool:
    """Nothing to run: no text and no files (stored before files were kept with messages)."""
    return not message.text.strip() and not message.attachments

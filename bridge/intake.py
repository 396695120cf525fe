"""The path of an inbound message: authorize, record, then command or dispatch.

A message is committed to the store before anything else happens to it, so
the transport may acknowledge it upstream as soon as :meth:`Intake.accept`
returns, and a crash after that point loses nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from bridge.commands import CommandHandler, parse_command
from bridge.config import Settings
from bridge.core.model import InboundMessage, Message
from bridge.core.text import safe_text
from bridge.core.transport import Accepted, InboundEvent
from bridge.logs import log_context
from bridge.metrics import Metrics
from bridge.store.base import Store, StoreError
from dispatcher import Dispatcher

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Intake:
    settings: Settings
    store: Store
    dispatcher: Dispatcher
    commands: CommandHandler
    metrics: Metrics
    on_accepted: Callable[[Message], None] = lambda message: None
    """Called for each message that will go to a run (shows it as received)."""
    wall_clock: Callable[[], float] = time.time

    async def accept(self, event: InboundEvent) -> Accepted:
        """The transports' sink. Returns once the event is durably recorded.

        Also while the service shuts down: the dispatcher then begins no run,
        so a message accepted now stays pending and runs after the restart.
        """
        with log_context(room=event.room):
            if isinstance(event, InboundMessage):
                # Chat text is made storable here, once (a lone surrogate, NUL).
                return await self._accept(replace(event, text=safe_text(event.text)))
            # Edits and deletions of messages not yet run: not handled yet.
            return Accepted.IGNORED

    async def _accept(self, inbound: InboundMessage) -> Accepted:
        room = self.settings.room(inbound.room)
        now = self.wall_clock()
        reason = None
        if room is None:
            reason = "room not configured"
        elif inbound.sender_is_bot:
            reason = "sender is a bot"
        elif not room.allows(inbound.sender):
            reason = "sender not allowed"
        command = parse_command(inbound.text, self.settings.commands.prefix)
        if (
            reason is None
            and room is not None
            and room.trigger == "mention"
            and not inbound.mentions_bot
            and command is None
        ):
            reason = "no mention"
        if reason is not None:
            self.metrics.messages.labels("ignored").inc()
            log.debug("ignored a message from %s: %s", inbound.sender, reason)
            if room is not None and reason != "sender is a bot":
                await self.store.record_ignored(inbound, reason, now)
            return Accepted.IGNORED

        message = await self.store.accept(inbound, now)
        if message is None:
            self.metrics.messages.labels("duplicate").inc()
            log.debug("duplicate delivery of %s", inbound.external_id)
            return Accepted.DUPLICATE
        if command is not None:
            self.metrics.messages.labels("command").inc()
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
        else:
            self.metrics.messages.labels("accepted").inc()
            self.dispatcher.submit(message)
            self.on_accepted(message)
        return Accepted.ACCEPTED

    async def recover(self, pending: list[Message]) -> int:
        """Re-enter messages accepted before a restart but never run, in order.

        Commands accepted just before a crash are settled, not run: agent
        runs and stops have effects, and a stale ``!stop`` must not hit a new run.
        """
        resumed = 0
        prefix = self.settings.commands.prefix
        for message in pending:
            if parse_command(message.text, prefix) is not None:
                await self.store.complete_command(message.id)
            elif self.settings.room(message.room) is None:
                log.warning("pending message %s is for a room no longer configured", message.id)
            else:
                self.dispatcher.submit(message)
                resumed += 1
        return resumed

"""The Matrix transport: one bot account, logged in (:mod:`.login`), synced
(:mod:`.sync`, inbound via :mod:`.inbound`) and answering (:mod:`.outbound`).

The client lives as long as :meth:`MatrixTransport.run`; the outbound side
sends through it while it is logged in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from bridge.core.model import (
    Attachment,
    ExternalMessageId,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
)
from bridge.core.transport import (
    TOOL_ASKED,
    Asked,
    Delivery,
    InboundSink,
    RoomBinding,
    RunPhase,
    Transport,
    TransportError,
)
from transports.backoff import Backoff
from transports.matrix.approvals import KnownRequests
from transports.matrix.client import new_client
from transports.matrix.inbound import InboundPolicy
from transports.matrix.login import log_in
from transports.matrix.media import fetch
from transports.matrix.outbound import MatrixOutbound
from transports.matrix.settings import MatrixSettings
from transports.matrix.sync import Syncer


class MatrixTransport(Transport):
    """Serves the configured Matrix rooms through one bot account.

    ``backoff`` paces reconnects (tests pass a fast one); ``typing_refresh_s``
    is how often an active typing notice is renewed before it expires.
    """

    name = TransportName("matrix")

    def __init__(
        self,
        settings: MatrixSettings,
        rooms: Sequence[RoomBinding],
        *,
        backoff: Backoff | None = None,
        typing_refresh_s: float = 20.0,
        send_attempts: int = 4,
    ) -> None:
        self._settings = settings
        self._backoff = backoff or Backoff()
        policy = InboundPolicy(
            user_id=settings.user_id,
            ignore_other_bots=settings.ignore_other_bots,
            ignore_users=frozenset(settings.ignore_users),
        )
        # Posted by the outbound side, recognised by the sync side (reactions to them).
        requests = KnownRequests()
        self._syncer = Syncer(
            settings,
            {binding.room_id: binding for binding in rooms},
            policy,
            self._backoff,
            self._tell_room,
            requests=requests,
        )
        self._outbound = MatrixOutbound(
            settings,
            self._syncer.synced,
            typing_refresh_s=typing_refresh_s,
            send_attempts=send_attempts,
            requests=requests,
        )

    @property
    def connected(self) -> bool:
        """True after a successful sync, until the next failed one."""
        return self._syncer.connected

    @property
    def reconnects(self) -> int:  # type: ignore[override]
        """How often the sync loop came back after losing the server."""
        return self._syncer.reconnects

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        """Log in, then sync until cancelled; ``ready`` is set after the first sync.

        When the sink raises :class:`~bridge.core.transport.SinkClosed`
        (shutdown) no more input is taken and the sync position stays put, but
        the client stays logged in for the answers of the grace period until
        cancelled. Raises :class:`~bridge.core.transport.TransportError` when
        the server refuses the credentials, which no retry can fix.
        """
        client = new_client(self._settings)
        try:
            await log_in(client, self._settings, self._backoff)
            self._outbound.client = client
            try:
                async with asyncio.TaskGroup() as tasks:
                    typing = tasks.create_task(
                        self._outbound.keep_typing(client), name="matrix-typing"
                    )
                    try:
                        await self._syncer.run(client, sink, ready)
                    finally:
                        # The sync loop ends only by raising: the helper must
                        # not keep the group, and so run(), open.
                        typing.cancel()
            except ExceptionGroup as group:
                # The typing helper never fails: the group only wraps the sync
                # loop's own error, which callers expect as itself.
                raise group.exceptions[0] from None
        finally:
            self._outbound.client = None
            await client.close()

    async def _tell_room(self, room_id: RoomId, text: str, key: str) -> None:
        """A notice from inside the sync loop: never waits for a sync, posted once per ``key``."""
        reply = Reply(RoomKey(self.name, room_id), text, ReplyKind.NOTICE)
        await self._outbound.send(reply, Delivery(key, 0, _nothing_to_record), wait_for_room=False)

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        """Post ``reply`` as one or more events; returns the last event's id."""
        return await self._outbound.send(reply, delivery)

    async def send_file(self, reply: Reply, key: str) -> ExternalMessageId | None:
        """Upload and post a file (encrypted in an encrypted room); the event's id."""
        return await self._outbound.send_file(reply, key)

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        await self._outbound.edit(room, message_id, text)

    async def post_approval(
        self, request: Reply, ref: str, asked: Asked = TOOL_ASKED
    ) -> ExternalMessageId | None:
        """Post the request and react ✅ 🔁 ❌ to it, for people to click (see .approvals)."""
        return await self._outbound.post_approval(request, ref, asked)

    def approval_fits(self, room: RoomKey, text: str) -> bool:
        """Whether the request (with the line on its reactions) is one event."""
        return self._outbound.approval_fits(room, text)

    async def close_approval(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        """Edit the request into its outcome; the bot's reactions go."""
        await self._outbound.close_approval(room, message_id, text)

    async def set_typing(self, room: RoomKey, typing: bool) -> None:
        await self._outbound.set_typing(room, typing)

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        """A batch received shows the bot typing at once (see ``MatrixOutbound.set_phase``)."""
        await self._outbound.set_phase(room, phase)

    async def fetch_attachment(self, attachment: Attachment, dest: Path, limit_bytes: int) -> None:
        """Download a shared file (decrypted and hash-checked when encrypted, see .media)."""
        client = self._outbound.client
        if client is None:
            raise TransportError(self.name, "not logged in")
        await fetch(client, attachment, dest, limit_bytes)


async def _nothing_to_record(index: int, message_id: ExternalMessageId) -> None:
    """A one-part notice needs no progress record: its key alone makes it idempotent."""

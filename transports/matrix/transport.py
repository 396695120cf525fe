"""The Matrix transport: one bot account, logged in (:mod:`.login`), synced
(:mod:`.sync`, inbound via :mod:`.inbound`) and answering (:mod:`.outbound`).

The client lives as long as :meth:`MatrixTransport.run`; the outbound side
(``transport.outbound``) sends and fetches through it while it is logged in
(docs/deployment.md, "Inside the Matrix transport").
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomId, RoomKey, TransportName
from bridge.core.transport import Delivery, InboundSink, RoomBinding, Transport
from transports.backoff import Backoff
from transports.matrix.approvals import KnownRequests
from transports.matrix.client import new_client
from transports.matrix.inbound import InboundPolicy
from transports.matrix.login import log_in
from transports.matrix.outbound import MatrixOutbound
from transports.matrix.settings import MatrixSettings
from transports.matrix.sync import Syncer


class MatrixTransport(Transport):
    """Serves the configured Matrix rooms through one bot account.

    ``backoff`` paces reconnects (tests pass a fast one); ``typing_refresh_s``
    is how often an active typing notice is renewed before it expires.
    """

    name = TransportName("matrix")
    outbound: MatrixOutbound

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
        self.outbound = MatrixOutbound(
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
            self.outbound.client = client
            try:
                async with asyncio.TaskGroup() as tasks:
                    typing = tasks.create_task(
                        self.outbound.keep_typing(client), name="matrix-typing"
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
            self.outbound.client = None
            await client.close()

    async def _tell_room(self, room_id: RoomId, text: str, key: str) -> None:
        """A notice from inside the sync loop: never waits for a sync, posted once per ``key``."""
        reply = Reply(RoomKey(self.name, room_id), text, ReplyKind.NOTICE)
        await self.outbound.send(reply, Delivery(key, 0, _nothing_to_record), wait_for_room=False)


async def _nothing_to_record(index: int, message_id: ExternalMessageId) -> None:
    """A one-part notice needs no progress record: its key alone makes it idempotent."""

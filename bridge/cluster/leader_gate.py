"""A transport only one replica may connect at a time: Matrix.

With replicas, the Matrix transport runs behind this gate: a replica connects it (and owns
the Matrix conversations) only while it holds the transport's leader lease; the others are
ready without it and keep trying. A leader that loses its lease fails the service rather than
risk two replicas syncing one account; a paused holder of the shared store's lock is stopped
first (``unblock``, :mod:`bridge.cluster.paused_holders`) (docs/replicas.md, "Transports").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from bridge.cluster.replica import Cluster
from bridge.core.transport import InboundSink, Transport, TransportError
from bridge.store.base import StoreError

log = logging.getLogger(__name__)


class LeaderGated(Transport):
    """``inner``, connected only while this replica leads its transport."""

    def __init__(
        self,
        inner: Transport,
        cluster: Cluster,
        retry_s: float,
        unblock: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        # Only the leader is connected and owns the transport's conversations, so only it
        # sends: the outbound side is the inner one, as it is.
        self.outbound = inner.outbound
        self._cluster = cluster
        self._retry_s = retry_s
        self._unblock = unblock
        """Frees what a predecessor paused past its lease holds, before connecting."""

    @property
    def reconnects(self) -> int:  # type: ignore[override]
        return self.inner.reconnects

    @property
    def connected(self) -> bool:
        # A follower is ready without the connection: it is not its to hold.
        return self.inner.connected if self._cluster.leads(self.name) else True

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        ready.set()
        await self._wait_for_lead()
        if self._unblock is not None:
            try:
                await self._unblock()
            except (OSError, StoreError) as exc:
                # Connecting goes on: at worst its sync retries until the store is free.
                log.warning("could not look for a paused predecessor of %s: %s", self.name, exc)
        log.info("this replica leads %s: connecting", self.name)
        lost = asyncio.ensure_future(self._cluster.lost_lead.wait())
        inner = asyncio.ensure_future(self.inner.run(sink, asyncio.Event()))
        try:
            await asyncio.wait({lost, inner}, return_when=asyncio.FIRST_COMPLETED)
            if inner.done():
                return inner.result()  # input ended, or the transport failed
            raise TransportError(
                self.name, "lost the leader lease: stopping rather than sync beside another replica"
            )
        finally:
            for task in (lost, inner):
                task.cancel()
            await asyncio.wait({lost, inner})

    async def _wait_for_lead(self) -> None:
        """Until this replica leads (the lease is free once the leader is gone)."""
        while True:
            try:
                if await self._cluster.try_lead(self.name):
                    return
            except StoreError as exc:
                log.warning("could not ask for the %s leader lease: %s", self.name, exc)
            await asyncio.sleep(self._retry_s)


__all__ = ["LeaderGated"]

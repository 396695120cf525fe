"""A run's slot as the layer that asks people sees it: lent while it waits, taken back.

:meth:`SlotLease.lend` gives the run's slot to the next in line while the run waits for
a person; :meth:`SlotLease.reclaim` asks for one back before the run goes on, and says
how many reclaimers are ahead. The dispatcher resolves the wait: True once the run holds
a slot, False if it ended first. :meth:`SlotLease.went_on`: claude went on without an
answer (it withdrew its request), so the run holds a slot at once. All are no-ops once
the run ended (docs/live-runs.md, "Waiting runs and the run slots").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Reclaim:
    """One :meth:`SlotLease.reclaim`: ``ahead`` reclaimers before it (0 if it holds a slot)."""

    ahead: int
    resumed: asyncio.Future[bool]
    """True once the run holds a slot; False if it ended first."""


class SlotLease:
    """A run's hold on its slot; see the module docstring."""

    __slots__ = ("_ended", "_go_on", "_lend", "_pending", "_reclaim")

    def __init__(
        self,
        lend: Callable[[], None],
        reclaim: Callable[[], int | None],
        go_on: Callable[[], None] = lambda: None,
    ) -> None:
        self._lend = lend
        self._reclaim = reclaim
        self._go_on = go_on
        self._pending: asyncio.Future[bool] | None = None
        self._ended = False

    def lend(self) -> None:
        """The run waits for a person: its slot may go to another room meanwhile."""
        if not self._ended:
            self._lend()

    def reclaim(self) -> Reclaim:
        """The run is to go on: a slot back, now or when one frees."""
        loop = asyncio.get_running_loop()
        if self._ended:
            return Reclaim(0, _done(loop, False))
        ahead = self._reclaim()
        if ahead is None:
            self.resumed(True)
            return Reclaim(0, _done(loop, True))
        if self._pending is None or self._pending.done():
            self._pending = loop.create_future()
        return Reclaim(ahead, self._pending)

    def went_on(self) -> None:
        """claude works on without an answer from here (it withdrew its request): the
        run holds a slot at once, whether it lent its slot or waited for one back."""
        if not self._ended:
            self._go_on()

    @property
    def waiting(self) -> bool:
        """A reclaim waits for a slot."""
        return self._pending is not None and not self._pending.done()

    def resumed(self, held: bool) -> None:
        """The dispatcher's word: the run holds a slot again (or, False, it ended)."""
        if self._pending is not None and not self._pending.done():
            self._pending.set_result(held)
        self._pending = None

    def ended(self) -> None:
        """The run is over: a reclaim waiting is answered False, later calls do nothing."""
        self._ended = True
        self.resumed(False)


def _done(loop: asyncio.AbstractEventLoop, value: bool) -> asyncio.Future[bool]:
    future: asyncio.Future[bool] = loop.create_future()
    future.set_result(value)
    return future

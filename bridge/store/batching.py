"""Group commit: concurrent writes share one transaction, with no background task.

:meth:`GroupCommit.submit` writes items in submission order, one transaction at a time,
led by a caller (leader/follower); each caller gets its own item's result or error, and a
cancelled caller's item is either not written or reported truly to the others
(docs/operations.md, "How the store writes").
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

DEFAULT_LIMIT = 256
"""Items per transaction at most: bounds a transaction's size and duration."""


class Committing:
    """Handed to a ``write``: it calls this right before its commit.

    From then on the leader no longer cancels the transaction: a commit
    interrupted halfway would leave the others not knowing whether their
    items were stored.
    """

    __slots__ = ("started",)

    def __init__(self) -> None:
        self.started = False

    def __call__(self) -> None:
        self.started = True


@dataclass(frozen=True, slots=True)
class Failed:
    """A ``write``'s result for an item that failed on its own (the others did not)."""

    error: Exception


Write = Callable[[Sequence[ItemT], Committing], Coroutine[Any, Any, Sequence[ResultT | Failed]]]
"""Writes the items in one transaction, returning one result per item, in order.

It raises when nothing was committed, and lets cancellation through (rolling
back) until it calls its :class:`Committing`. An item's result may be
:class:`Failed`: its caller gets that error.
"""


class _Lead:
    """A follower's turn came: it leads the next transaction."""


_LEAD = _Lead()


@dataclass(eq=False, slots=True)
class _Waiter(Generic[ItemT, ResultT]):
    item: ItemT
    turn: asyncio.Future[ResultT | _Lead] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    taken: bool = False
    """In a transaction (no longer queued)."""


class GroupCommit(Generic[ItemT, ResultT]):
    """Runs concurrent :meth:`submit` calls in shared transactions, one at a time."""

    def __init__(self, write: Write[ItemT, ResultT], *, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self._write = write
        self._limit = limit
        self._queue: deque[_Waiter[ItemT, ResultT]] = deque()
        # The caller leading (or promoted to lead) the current transaction.
        # None means nothing is under way, and then the queue is empty.
        self._leader: _Waiter[ItemT, ResultT] | None = None
        self._in_flight: asyncio.Task[Sequence[ResultT | Failed]] | None = None

    @property
    def queued(self) -> int:
        """Items waiting for a transaction (not counting one in flight)."""
        return len(self._queue)

    async def submit(self, item: ItemT) -> ResultT:
        """Write ``item`` in the next transaction; return once it is committed.

        Raises what the ``write`` raised for the transaction that held it.
        """
        waiter: _Waiter[ItemT, ResultT] = _Waiter(item)
        self._queue.append(waiter)
        if self._leader is None:
            self._leader = waiter
            try:
                # One turn of the loop before taking the queue: callers that
                # submit together (a transport handing over one sync
                # response's messages at once) share this transaction instead
                # of the first going alone.
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                self._queue.remove(waiter)
                self._hand_over()
                raise
            return await self._lead(waiter)
        try:
            turn = await waiter.turn
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        if isinstance(turn, _Lead):
            return await self._lead(waiter)
        return turn

    def fail_queued(self, error: Callable[[], Exception]) -> None:
        """Fail every queued item with a fresh ``error()`` (the store is closing).

        A transaction in flight finishes. A caller already promoted to lead
        keeps its place: its ``write`` raises for its transaction.
        """
        keep = [w for w in self._queue if w is self._leader]
        for waiter in self._queue:
            if waiter is not self._leader and not waiter.turn.done():
                waiter.turn.set_exception(error())
        self._queue = deque(keep)

    async def idle(self) -> None:
        """Wait until no transaction is in flight (the store is closing).

        Only waits: the leader of that transaction still hands out its results.
        """
        while (transaction := self._in_flight) is not None and not transaction.done():
            await asyncio.wait([transaction])

    async def _lead(self, own: _Waiter[ItemT, ResultT]) -> ResultT:
        group = self._take()
        committing = Committing()
        # A task of its own so that a cancelled leader can let the commit
        # finish; the leader always awaits it to the end.
        transaction = asyncio.create_task(self._write([w.item for w in group], committing))
        self._in_flight = transaction
        cancelled: asyncio.CancelledError | None = None
        try:
            # wait() neither raises the transaction's error nor cancels it.
            await asyncio.wait([transaction])
        except asyncio.CancelledError as exc:
            cancelled = exc
            if not committing.started:
                transaction.cancel()
            await settle(transaction)
        finally:
            self._in_flight = None
        if transaction.cancelled() and cancelled is not None:
            # Rolled back: the others go again under a new leader.
            self._requeue([w for w in group if w is not own])
            self._hand_over()
            raise cancelled
        results, error = _outcome(transaction, len(group))
        if error is not None:
            for waiter in group:
                if waiter is not own and not waiter.turn.done():
                    waiter.turn.set_exception(error)
            self._hand_over()
            if cancelled is not None:
                raise cancelled
            raise error
        for waiter, result in zip(group, results, strict=True):
            if waiter is own or waiter.turn.done():
                continue
            if isinstance(result, Failed):
                waiter.turn.set_exception(result.error)
            else:
                waiter.turn.set_result(result)
        self._hand_over()
        if cancelled is not None:
            raise cancelled
        mine = results[group.index(own)]
        if isinstance(mine, Failed):
            raise mine.error
        return mine

    def _take(self) -> list[_Waiter[ItemT, ResultT]]:
        # The leader is at the head: it was queued first or promoted from there.
        group: list[_Waiter[ItemT, ResultT]] = []
        while self._queue and len(group) < self._limit:
            waiter = self._queue.popleft()
            if waiter is not self._leader and waiter.turn.cancelled():
                continue  # cancelled, about to abandon: leave it out
            waiter.taken = True
            group.append(waiter)
        return group

    def _requeue(self, waiters: list[_Waiter[ItemT, ResultT]]) -> None:
        for waiter in reversed(waiters):
            if not waiter.turn.done():
                waiter.taken = False
                self._queue.appendleft(waiter)

    def _hand_over(self) -> None:
        """Pass the lead to the oldest queued caller still waiting, if any."""
        self._leader = None
        while self._queue:
            head = self._queue[0]
            if head.turn.done():  # cancelled
                self._queue.popleft()
                continue
            self._leader = head
            head.turn.set_result(_LEAD)
            return

    def _abandon(self, waiter: _Waiter[ItemT, ResultT]) -> None:
        """A follower was cancelled: drop its item if no transaction holds it."""
        if waiter.taken:
            return  # its transaction decides; the leader skips its answer
        if waiter in self._queue:
            self._queue.remove(waiter)
        if self._leader is waiter:
            # Promoted, but cancelled before it could lead.
            self._hand_over()


def _outcome(
    transaction: asyncio.Task[Sequence[ResultT | Failed]], size: int
) -> tuple[Sequence[ResultT | Failed], Exception | None]:
    """The results of a finished transaction, or the error for all its items."""
    if transaction.cancelled():
        # Nobody cancelled it: a write must not cancel itself.
        return (), RuntimeError("the transaction was cancelled from within")
    error = transaction.exception()
    if error is not None:
        if not isinstance(error, Exception):
            raise error  # KeyboardInterrupt and the like: not the callers' business
        return (), error
    results = transaction.result()
    if len(results) != size:
        return (), RuntimeError(f"write returned {len(results)} results for {size} items")
    return results, None


async def settle(future: asyncio.Future[Any]) -> None:
    """Wait until ``future`` (a task too) is done, even through further cancellations.

    The caller re-raises the cancellation it already caught.
    """
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            continue

"""GroupCommit on its own: who leads, what goes into which transaction, and
what every caller is told when callers are cancelled or a transaction fails.

The write target is a small in-memory journal whose transactions wait at
gates the test opens, so every interleaving here is exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from bridge.store.base import StoreError
from bridge.store.batching import Committing, Failed, GroupCommit


class Journal:
    """A write target: transaction ``n`` waits at ``gates[n]`` if there is one.

    ``before`` gates hold a transaction before it calls ``committing()`` (it
    can still roll back), ``during`` gates hold it inside its commit.
    """

    def __init__(self) -> None:
        self.attempts: list[list[str]] = []
        """The items of every transaction begun, committed or not."""
        self.committed: list[str] = []
        self.before: dict[int, asyncio.Event] = {}
        self.during: dict[int, asyncio.Event] = {}
        self.reject: set[str] = set()
        self.refuse: set[str] = set()
        """Items failed on their own, the rest of the transaction going through."""
        self._changed = asyncio.Condition()

    async def write(self, items: Sequence[str], committing: Committing) -> list[str | Failed]:
        n = len(self.attempts)
        self.attempts.append(list(items))
        async with self._changed:
            self._changed.notify_all()
        if n in self.before:
            await self.before[n].wait()
        if self.reject.intersection(items):
            raise StoreError(f"rejected {sorted(self.reject.intersection(items))}")
        committing()
        if n in self.during:
            await self.during[n].wait()
            if self.reject.intersection(items):  # the commit itself fails
                raise StoreError(f"rejected {sorted(self.reject.intersection(items))}")
        self.committed.extend(i for i in items if i not in self.refuse)
        return [
            Failed(StoreError(f"refused {item}")) if item in self.refuse else f"{item}!"
            for item in items
        ]

    def hold(self, n: int, *, during_commit: bool = False) -> asyncio.Event:
        """A gate for transaction ``n``: it waits until the event is set."""
        gate = asyncio.Event()
        (self.during if during_commit else self.before)[n] = gate
        return gate

    async def begun(self, n: int) -> None:
        """Wait until ``n`` transactions have begun."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.attempts) >= n)


class Callers:
    """Submits from tasks of their own, each queued before ``start`` returns."""

    def __init__(self, group: GroupCommit[str, str]) -> None:
        self.group = group
        self.tasks: list[asyncio.Task[str]] = []

    async def start(self, item: str) -> asyncio.Task[str]:
        queued = asyncio.Event()

        async def call() -> str:
            queued.set()
            # submit() queues the item before it first suspends, so the
            # test, woken by the event, runs only once the item is queued.
            return await self.group.submit(item)

        task = asyncio.create_task(call())
        self.tasks.append(task)
        await queued.wait()
        return task


@pytest.fixture
def journal() -> Journal:
    return Journal()


@pytest.fixture
async def callers(journal: Journal) -> AsyncIterator[Callers]:
    made = Callers(GroupCommit(journal.write))
    try:
        yield made
    finally:
        # A failed test must not leave callers behind.
        for task in made.tasks:
            task.cancel()
        await asyncio.gather(*made.tasks, return_exceptions=True)


async def test_sequential_calls_commit_one_by_one(journal: Journal, callers: Callers) -> None:
    results = [await callers.group.submit(item) for item in ("a", "b", "c")]
    assert results == ["a!", "b!", "c!"]
    assert journal.attempts == [["a"], ["b"], ["c"]]


async def test_calls_during_a_commit_share_the_next_in_call_order(
    journal: Journal, callers: Callers
) -> None:
    gate = journal.hold(0)
    leader = await callers.start("a")
    await journal.begun(1)
    followers = [await callers.start(item) for item in "bcdef"]
    assert callers.group.queued == 5
    gate.set()
    assert await leader == "a!"
    assert [await f for f in followers] == ["b!", "c!", "d!", "e!", "f!"]
    assert journal.attempts == [["a"], ["b", "c", "d", "e", "f"]]
    assert callers.group.queued == 0


async def test_limit_bounds_each_transaction(journal: Journal) -> None:
    group: GroupCommit[str, str] = GroupCommit(journal.write, limit=2)
    callers = Callers(group)
    gate = journal.hold(0)
    tasks = [await callers.start("a")]
    await journal.begun(1)
    tasks += [await callers.start(item) for item in "bcde"]
    gate.set()
    assert await asyncio.gather(*tasks) == ["a!", "b!", "c!", "d!", "e!"]
    assert journal.attempts == [["a"], ["b", "c"], ["d", "e"]]


def test_limit_must_be_positive(journal: Journal) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        GroupCommit(journal.write, limit=0)


async def test_follower_cancelled_while_queued_is_not_written(
    journal: Journal, callers: Callers
) -> None:
    gate = journal.hold(0)
    leader = await callers.start("a")
    await journal.begun(1)
    b, c, d = [await callers.start(item) for item in "bcd"]
    c.cancel()
    with pytest.raises(asyncio.CancelledError):
        await c
    gate.set()
    assert [await leader, await b, await d] == ["a!", "b!", "d!"]
    assert journal.committed == ["a", "b", "d"]


async def test_follower_cancelled_in_its_transaction_leaves_the_rest_answered(
    journal: Journal, callers: Callers
) -> None:
    """Its item may still be committed (documented); nobody else notices."""
    first, second = journal.hold(0), journal.hold(1)
    leader = await callers.start("a")
    await journal.begun(1)
    b, c, d = [await callers.start(item) for item in "bcd"]
    first.set()
    await journal.begun(2)  # b leads [b, c, d]
    c.cancel()
    second.set()
    with pytest.raises(asyncio.CancelledError):
        await c
    assert [await leader, await b, await d] == ["a!", "b!", "d!"]
    assert journal.attempts == [["a"], ["b", "c", "d"]]
    assert journal.committed == ["a", "b", "c", "d"]
    assert await callers.group.submit("e") == "e!"


async def test_leader_cancelled_before_commit_hands_its_group_over(
    journal: Journal, callers: Callers
) -> None:
    first, second = journal.hold(0), journal.hold(1)
    leader = await callers.start("a")
    await journal.begun(1)
    b, c, d = [await callers.start(item) for item in "bcd"]
    first.set()
    await journal.begun(2)  # b leads [b, c, d], held before its commit
    b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await b
    # Rolled back: c and d went again, in order, under c.
    assert [await leader, await c, await d] == ["a!", "c!", "d!"]
    assert journal.attempts == [["a"], ["b", "c", "d"], ["c", "d"]]
    assert journal.committed == ["a", "c", "d"]
    assert second.is_set() is False  # the rolled-back transaction never went on


async def test_leader_cancelled_during_commit_waits_for_it(
    journal: Journal, callers: Callers
) -> None:
    """A commit cut short would leave followers not knowing: it finishes first."""
    committing = journal.hold(0, during_commit=True)
    gate = journal.hold(1, during_commit=True)
    leader = await callers.start("a")
    await journal.begun(1)
    b, c = [await callers.start(item) for item in "bc"]
    committing.set()
    await journal.begun(2)  # b leads [b, c], inside its commit
    b.cancel()
    b.cancel()  # a second cancellation while it waits changes nothing
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await b
    assert [await leader, await c] == ["a!", "c!"]
    assert journal.committed == ["a", "b", "c"]


async def test_follower_cancelled_as_the_lead_passes_is_skipped(
    journal: Journal, callers: Callers
) -> None:
    """The oldest queued caller, due to lead next, was cancelled: the next one leads."""
    gate = journal.hold(0)
    leader = await callers.start("a")
    await journal.begun(1)
    b, c = [await callers.start(item) for item in "bc"]
    gate.set()
    b.cancel()  # lands before the leader finishes and hands over
    with pytest.raises(asyncio.CancelledError):
        await b
    assert [await leader, await c] == ["a!", "c!"]
    assert journal.attempts == [["a"], ["c"]]


async def test_rolled_back_group_goes_again_without_its_leader(
    journal: Journal, callers: Callers
) -> None:
    """A failure found on the retry reaches only the retried group."""
    first, second = journal.hold(0), journal.hold(1)
    journal.reject.add("c")
    leader = await callers.start("a")
    await journal.begun(1)
    b, c = [await callers.start(item) for item in "bc"]
    first.set()
    await journal.begun(2)  # b leads [b, c], held before its commit
    b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await b
    assert await leader == "a!"
    # b's transaction was rolled back; c went again alone, and failed alone.
    with pytest.raises(StoreError, match="rejected"):
        await c
    assert journal.attempts == [["a"], ["b", "c"], ["c"]]
    assert second.is_set() is False


async def test_an_error_reaches_exactly_its_transaction(journal: Journal, callers: Callers) -> None:
    first, second = journal.hold(0), journal.hold(1)
    journal.reject.add("bad")
    leader = await callers.start("a")
    await journal.begun(1)
    in_group = [await callers.start(item) for item in ("b", "bad", "c")]
    first.set()
    await journal.begun(2)
    later = await callers.start("d")
    second.set()
    assert await leader == "a!"
    for task in in_group:
        with pytest.raises(StoreError, match="rejected"):
            await task
    assert await later == "d!"
    assert journal.committed == ["a", "d"]


async def test_fail_queued_fails_only_the_queued(journal: Journal, callers: Callers) -> None:
    gate = journal.hold(0)
    leader = await callers.start("a")
    await journal.begun(1)
    b, c = [await callers.start(item) for item in "bc"]
    callers.group.fail_queued(lambda: StoreError("the store is closed"))
    assert callers.group.queued == 0
    for task in (b, c):
        with pytest.raises(StoreError, match="closed"):
            await task
    gate.set()
    assert await leader == "a!"
    assert journal.committed == ["a"]


async def test_an_item_failed_on_its_own_fails_only_its_caller(
    journal: Journal, callers: Callers
) -> None:
    gate = journal.hold(0)
    journal.refuse.update({"b", "c"})
    leader = await callers.start("a")
    await journal.begun(1)
    b, c, d = [await callers.start(item) for item in "bcd"]
    gate.set()
    assert [await leader, await d] == ["a!", "d!"]
    for task in (b, c):
        with pytest.raises(StoreError, match="refused"):
            await task
    # A leader's own item can fail on its own too.
    assert await callers.group.submit("e") == "e!"
    with pytest.raises(StoreError, match="refused b"):
        await callers.group.submit("b")
    assert journal.committed == ["a", "d", "e"]


async def test_commit_failing_after_the_leader_was_cancelled(
    journal: Journal, callers: Callers
) -> None:
    """The followers get the error, the leader its cancellation."""
    first, second = journal.hold(0), journal.hold(1, during_commit=True)
    leader = await callers.start("a")
    await journal.begun(1)
    b, c = [await callers.start(item) for item in "bc"]
    first.set()
    await journal.begun(2)  # b leads [b, c], inside its commit
    b.cancel()
    journal.reject.add("c")  # the journal checks again after the commit gate
    second.set()
    with pytest.raises(asyncio.CancelledError):
        await b
    with pytest.raises(StoreError, match="rejected"):
        await c
    assert await leader == "a!"

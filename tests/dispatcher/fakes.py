"""Test doubles for the dispatcher: message factory, a controllable execute, serving."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from bridge.core.model import (
    Batch,
    ExternalMessageId,
    Message,
    MessageId,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from dispatcher import DispatchedRun, Dispatcher

GUARD_S = 10.0
"""Upper bound on waiting for an event that must come: turns a hang into a failure."""


def room(n: int | str) -> RoomKey:
    return RoomKey(TransportName("console"), RoomId(f"room-{n}"))


class Messages:
    """Makes messages with increasing ids, as the store would."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def __call__(
        self, key: RoomKey, text: str = "hi", thread: str | None = None, sender: str = "alice"
    ) -> Message:
        n = next(self._ids)
        return Message(
            id=MessageId(n),
            room=key,
            sender=UserId(sender),
            text=text,
            external_id=ExternalMessageId(f"ev-{n}"),
            received_at=0.0,
            thread=thread,
        )


class Call:
    """One call of the fake execute."""

    def __init__(self, run: DispatchedRun, *, adopted: bool) -> None:
        self.run = run
        self.batch = run.batch
        self.adopted = adopted
        """Called through :meth:`FakeExecute.adopted` (a run reattached after a restart)."""
        self.release = asyncio.Event()
        self.error: Exception | None = None
        self.cancelled = asyncio.Event()
        """Set when the call got ``CancelledError``."""
        self.ended = asyncio.Event()
        self.cleanup_gate: asyncio.Event | None = None
        """If set, a cancelled call waits for it before ending (a slow cleanup)."""


class FakeExecute:
    """An ``execute`` that records batches and runs until the test releases it.

    It also checks, at every call, that its room has no other call active
    and that no more than ``cap`` calls the dispatcher started itself are
    active (adopted runs may go beyond it).
    """

    def __init__(
        self,
        cap: int | None = None,
        *,
        auto: bool = False,
        log: list[tuple[RoomKey, tuple[Message, ...]]] | None = None,
    ) -> None:
        self.cap = cap
        self.log = log
        """If given, each call appends its room and messages (tests add drops in between);
        calls of adopted runs do not: their messages came from an earlier process."""
        self.auto = auto
        """Calls end at once, without waiting for a release."""
        self.slow_cleanup = False
        """Cancelled calls wait for their ``cleanup_gate`` before ending."""
        self.steer_answer: Callable[[], bool] | None = None
        """If set, runs (not adopted ones) take steer batches when it says so; the
        batches taken go to ``log`` too."""
        self.calls: list[Call] = []
        self.active: dict[RoomKey, Call] = {}
        self.violations: list[str] = []
        self._new_call = asyncio.Event()

    @property
    def batches(self) -> list[Batch]:
        return [call.batch for call in self.calls]

    async def __call__(self, run: DispatchedRun) -> None:
        await self._call(run, adopted=False)

    async def adopted(self, run: DispatchedRun) -> None:
        """The ``execute`` to hand to :meth:`Dispatcher.adopt`: recorded alike."""
        await self._call(run, adopted=True)

    async def _call(self, run: DispatchedRun, *, adopted: bool) -> None:
        batch = run.batch
        call = Call(run, adopted=adopted)
        if self.slow_cleanup:
            call.cleanup_gate = asyncio.Event()
        self.calls.append(call)
        if self.log is not None and not adopted:
            self.log.append((batch.room, batch.messages))
        answer = self.steer_answer
        if answer is not None and not adopted:
            log = self.log

            def steer(offered: Batch, interrupt: bool) -> bool:
                if offered.room != batch.room or batch.room not in self.active:
                    self.violations.append(f"{offered.room} steered outside its run")
                taken = answer()
                if taken and log is not None:
                    log.append((offered.room, offered.messages))
                return taken

            run.steer = steer
        if batch.room in self.active:
            self.violations.append(f"two runs in {batch.room}")
        self.active[batch.room] = call
        own = sum(not c.adopted for c in self.active.values())
        if self.cap is not None and not adopted and own > self.cap:
            self.violations.append(f"{own} runs active, cap {self.cap}")
        self._new_call.set()
        try:
            if not self.auto:
                await call.release.wait()
            if call.error is not None:
                raise call.error
        except asyncio.CancelledError:
            call.cancelled.set()
            if call.cleanup_gate is not None:
                await call.cleanup_gate.wait()
            raise
        finally:
            del self.active[batch.room]
            call.ended.set()

    async def started(self, key: RoomKey) -> Call:
        """Wait until ``execute`` is running for ``key``."""
        async with asyncio.timeout(GUARD_S):
            while key not in self.active:
                self._new_call.clear()
                await self._new_call.wait()
        return self.active[key]

    async def finish(self, key: RoomKey, error: Exception | None = None) -> Call:
        """Let the room's running call return (or raise ``error``) and wait until it has.

        When this returns the dispatcher has processed the end of the run:
        it does so in the same step in which ``execute`` returns.
        """
        call = await self.started(key)
        call.error = error
        call.release.set()
        async with asyncio.timeout(GUARD_S):
            await call.ended.wait()
        return call

    async def cancelled(self, call: Call) -> None:
        """Wait until ``call`` got ``CancelledError``."""
        async with asyncio.timeout(GUARD_S):
            await call.cancelled.wait()

    async def ended(self, call: Call) -> None:
        """Wait until ``call`` has ended (the dispatcher has then processed its end)."""
        async with asyncio.timeout(GUARD_S):
            await call.ended.wait()

    def release_all(self) -> None:
        """From now on calls end at once; the active ones end too."""
        self.auto = True
        for call in self.active.values():
            call.release.set()


@asynccontextmanager
async def serving(dispatcher: Dispatcher) -> AsyncIterator[asyncio.Task[None]]:
    """Serve ``dispatcher`` for the body of the ``async with``; cancel it after."""
    ready = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        task = group.create_task(dispatcher.serve(ready))
        async with asyncio.timeout(GUARD_S):
            await ready.wait()
        try:
            yield task
        finally:
            task.cancel()

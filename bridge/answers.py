"""Answers to commands, sent after the sink returned, in order per room.

A command takes effect inside the sink (so that a later message or command
sees it), but its answer is a network call that may be slow or
rate-limited: awaiting it there would delay the transport's acknowledgement
of every later event. Each room's answers go out one after another, in the
order the commands came, from a task in the service's task group.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from bridge.core.model import Message, RoomKey

log = logging.getLogger(__name__)

Send = Callable[[Message, str], Awaitable[None]]


class OrderedAnswers:
    """Queues answers per room; one worker task per room while it has any."""

    def __init__(self, send: Send) -> None:
        """``send`` delivers one answer (the replier's, which logs failures)."""
        self._send = send
        self._queues: dict[RoomKey, deque[tuple[Message, str]]] = {}
        self._workers: set[asyncio.Task[None]] = set()
        self._tasks: asyncio.TaskGroup | None = None

    def attach(self, tasks: asyncio.TaskGroup) -> None:
        """From now on answers are sent from tasks owned by ``tasks``."""
        self._tasks = tasks

    async def answer(self, message: Message, text: str) -> None:
        """Queue an answer to ``message``; returns at once once attached.

        Before :meth:`attach` (no task owner yet) the answer is sent inline.
        """
        if self._tasks is None:
            await self._send(message, text)
            return
        queue = self._queues.get(message.room)
        if queue is not None:
            queue.append((message, text))
            return
        self._queues[message.room] = deque([(message, text)])
        worker = self._tasks.create_task(self._drain(message.room), name=f"answers-{message.room}")
        self._workers.add(worker)
        worker.add_done_callback(self._workers.discard)

    async def _drain(self, room: RoomKey) -> None:
        queue = self._queues[room]
        try:
            while queue:
                message, text = queue[0]
                try:
                    await self._send(message, text)
                except Exception:
                    log.exception("could not answer a command in %s", room)
                queue.popleft()
        finally:
            del self._queues[room]

    async def close(self, grace_s: float) -> None:
        """Let queued answers go out for up to ``grace_s``, then cancel the rest."""
        self._tasks = None
        if self._workers:
            await asyncio.wait(set(self._workers), timeout=grace_s)
        for worker in list(self._workers):
            worker.cancel()
        if self._workers:
            await asyncio.wait(set(self._workers))

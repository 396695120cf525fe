"""The console transport: one room on stdin/stdout, for trying chatbridge locally.

Each input line is a message from the configured local user. At end of input
:meth:`ConsoleTransport.run` returns, and the service finishes the room's
outstanding work and exits, so ``printf 'hello\\n' | chatbridge run`` works
as a script.
"""

from __future__ import annotations

import asyncio
import selectors
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO, TextIO

from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.transport import (
    TOOL_ASKED,
    Asked,
    Delivery,
    Duplex,
    InboundSink,
    RunPhase,
    SinkClosed,
)

NAME = TransportName("console")


def _watchable(fd: int) -> bool:
    """Whether the event loop's selector can wait for ``fd`` to become readable."""
    with selectors.DefaultSelector() as selector:
        try:
            selector.register(fd, selectors.EVENT_READ)
        except (PermissionError, ValueError):
            return False
    return True


class ConsoleTransport(Duplex):
    """Reads stdin and prints to stdout: one object is both sides."""

    name = NAME

    def __init__(
        self,
        room: str,
        user: str,
        *,
        stdin: BinaryIO | None = None,
        stdout: TextIO | None = None,
    ) -> None:
        self.room = RoomKey(NAME, RoomId(room))
        self.user = UserId(user)
        self._stdin = stdin if stdin is not None else sys.stdin.buffer
        self._stdout = stdout if stdout is not None else sys.stdout
        # Ids must stay unique across restarts: the store ignores a repeated id.
        self._prefix = uuid.uuid4().hex[:12]
        self._sent = 0

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        ready.set()
        count = 0
        async for line in self._lines():
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            if not text.strip():
                continue
            count += 1
            try:
                await sink(
                    InboundMessage(
                        room=self.room,
                        sender=self.user,
                        text=text,
                        external_id=ExternalMessageId(f"{self._prefix}-{count}"),
                    )
                )
            except SinkClosed:
                return

    async def _lines(self) -> AsyncIterator[bytes]:
        if not _watchable(self._stdin.fileno()):
            # What the event loop cannot watch (a regular file, /dev/null) never
            # blocks a read: read it directly, so its end of input is seen.
            # (asyncio would accept /dev/null and then never report anything.)
            for line in self._stdin:
                yield line
            return
        loop = asyncio.get_running_loop()
        # No line-length limit worth hitting: a pasted log is still one message.
        reader = asyncio.StreamReader(limit=16 * 1024 * 1024)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), self._stdin
        )
        try:
            while line := await reader.readline():
                yield line
        finally:
            transport.close()

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        """The sign of life: a line as soon as a message is received."""
        if phase is RunPhase.RECEIVED:
            self._print("· received")

    def _print(self, text: str) -> None:
        self._stdout.write(text + "\n")
        self._stdout.flush()

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        # One part per reply: a delivery that already has it is done.
        if delivery is not None and delivery.parts_done >= 1:
            return None
        self._sent += 1
        match reply.kind:
            case ReplyKind.RESULT:
                self._print(reply.text)
            case ReplyKind.PROGRESS:
                self._print("· " + " | ".join(reply.text.splitlines()))
            case ReplyKind.NOTICE:
                self._print("\n".join("* " + line for line in reply.text.splitlines()))
        sent = ExternalMessageId(f"out-{self._sent}")
        if delivery is not None:
            await delivery.part_sent(0, sent)
        return sent

    async def send_file(self, reply: Reply, key: str) -> ExternalMessageId | None:
        """A terminal shows no files: one line with the file's name and size, then the
        comment (the bridge's copy is removed once this returns)."""
        path = Path(reply.file or "")
        self._sent += 1
        size = (await asyncio.to_thread(path.stat)).st_size
        self._print(f"[file] {path.name} ({size} bytes)")
        if reply.text:
            self._print(reply.text)
        return ExternalMessageId(f"out-{self._sent}")

    async def edit(self, room: RoomKey, message_id: ExternalMessageId, text: str) -> None:
        self._print("· " + " | ".join(text.splitlines()))

    async def post_approval(
        self, request: Reply, ref: str, asked: Asked = TOOL_ASKED
    ) -> ExternalMessageId | None:
        """The request as a notice: a terminal has no buttons; its text says which
        commands answer it."""
        return await self.send(replace(request, kind=ReplyKind.NOTICE))

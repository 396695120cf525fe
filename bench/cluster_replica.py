"""One replica for bench/bench_cluster.py: the service `chatbridge run` builds
(``Service`` on the configured PostgreSQL, ``[cluster] enabled``), with an
in-process Slack-named transport in place of Slack, driven over stdin/stdout.

    python bench/cluster_replica.py CONFIG

stdin, one JSON object a line:
  {"op": "burst", "msgs": [[room, text], ...], "conc": N}
      accept them with N acceptors at once; answers {"op": "burst", "start",
      "end", "lat": [seconds per accept]}
  {"op": "say", "room": r, "text": t}   answers {"op": "said", "t0", "t1"}
stdout, also unprompted: {"op": "ready"}, {"op": "answer", "room", "text", "t"}
(a result reply reached the transport), {"op": "submit", "text", "t"} (a message
reached this replica's dispatcher), {"op": "stop", "room", "t"} (this replica's
dispatcher was told to stop a conversation). Times are ``time.monotonic()``,
one clock for every process on Linux.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

from bridge.config import load_settings
from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    Message,
    Reply,
    ReplyKind,
    RoomId,
    RoomKey,
    TransportName,
    UserId,
)
from bridge.core.transport import Delivery, Duplex, InboundSink, RunPhase
from bridge.service import Service, open_store

SLACK = TransportName("slack")


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class BenchSlack(Duplex):
    """Stands in for one replica's Slack connection: messages in, answers timed."""

    name = SLACK

    def __init__(self, prefix: str) -> None:
        self.sink: InboundSink | None = None
        self.prefix = prefix
        self._ids = 0

    async def run(self, sink: InboundSink, ready: asyncio.Event) -> None:
        self.sink = sink
        ready.set()
        await asyncio.Event().wait()

    async def say(self, room: str, text: str) -> None:
        assert self.sink is not None
        self._ids += 1
        key = RoomKey(SLACK, RoomId(room))
        external = ExternalMessageId(f"{self.prefix}-{self._ids}")
        await self.sink(InboundMessage(key, UserId("U1"), text, external))

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        if reply.kind is ReplyKind.RESULT:
            emit(
                {
                    "op": "answer",
                    "room": reply.room.room_id,
                    "text": reply.text,
                    "t": time.monotonic(),
                }
            )
        self._ids += 1
        return ExternalMessageId(f"{self.prefix}-out-{self._ids}")

    async def set_phase(
        self, room: RoomKey, message_ids: Sequence[ExternalMessageId], phase: RunPhase
    ) -> None:
        return None


def watch(service: Service) -> None:
    """Report when a message reaches the dispatcher and when a stop is asked of it
    (the dispatcher is a plain object: its methods are wrapped on the instance)."""
    dispatcher = service.parts.dispatcher
    submit, stop = dispatcher.submit, dispatcher.stop

    def timed_submit(message: Message, arrived: float | None = None) -> None:
        emit({"op": "submit", "text": message.text, "t": time.monotonic()})
        submit(message, arrived)

    def timed_stop(room: RoomKey) -> Any:
        emit({"op": "stop", "room": room.room_id, "t": time.monotonic()})
        return stop(room)

    dispatcher.submit = timed_submit  # type: ignore[method-assign]
    dispatcher.stop = timed_stop  # type: ignore[method-assign]


async def burst(chat: BenchSlack, msgs: list[list[str]], conc: int) -> None:
    queue = iter(msgs)
    lat: list[float] = []

    async def acceptor() -> None:
        for room, text in queue:
            t0 = time.monotonic()
            await chat.say(room, text)
            lat.append(time.monotonic() - t0)

    start = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        for _ in range(conc):
            tg.create_task(acceptor())
    emit({"op": "burst", "start": start, "end": time.monotonic(), "lat": lat})


async def commands(chat: BenchSlack) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with asyncio.TaskGroup() as tg:
        async for line in reader:
            cmd = json.loads(line)
            if cmd["op"] == "burst":
                tg.create_task(burst(chat, cmd["msgs"], cmd["conc"]))
            elif cmd["op"] == "say":
                t0 = time.monotonic()
                await chat.say(cmd["room"], cmd["text"])
                emit({"op": "said", "t0": t0, "t1": time.monotonic()})


async def main(config: Path) -> None:
    settings = load_settings(config)
    chat = BenchSlack(settings.cluster.replica_id or "r")
    store = await open_store(settings)
    try:
        service = Service(settings, store, [chat])
        watch(service)
        serving = asyncio.ensure_future(service.serve())
        ready = asyncio.ensure_future(service.ready.wait())
        await asyncio.wait({serving, ready}, return_when=asyncio.FIRST_COMPLETED)
        if serving.done():
            serving.result()
        emit({"op": "ready"})
        driving = asyncio.ensure_future(commands(chat))
        await asyncio.wait({serving, driving}, return_when=asyncio.FIRST_COMPLETED)
        service.request_stop()
        driving.cancel()
        await serving
    finally:
        await store.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main(Path(sys.argv[1])))

"""A Matrix user's ping to its answer: chatbridge against a bare echo bot, one Synapse.

What a user feels: the time from sending a message to seeing the answer in
their own ``/sync``. Both bots run on the same homeserver in the same run,
pinged alternately, so the homeserver's and the client's own costs are the
same for both; chatbridge (with the fake claude answering at once) differs
only by what it does itself, plus the debounce window the configuration asks
for (``coalesce_ms``).

Prints p50/p90/p99 of both, and chatbridge's time above echo + window.
With ``--breakdown`` the service logs its stage stamps (DEBUG) and the table
of where chatbridge's pings spent their time follows (see ``breakdown.py``).

With ``--prestart`` chatbridge runs with ``[runner] prestart = true``: the
room's claude is started when the ping opens its batch, inside the window.
With ``--keep-warm`` also ``prestart_keep_s = 30``: the room's next claude is
started as each run ends, so the next ping finds it ready (the pause after
each ping, ``RUN_END_PAUSE_S``, lets it start).

    python bench/bench_ping.py [--pings 60] [--coalesce-ms 50] [--prestart | --keep-warm]
        [--breakdown]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from nio import AsyncClient, RoomCreateResponse, RoomMessageText, SyncResponse

sys.path.insert(0, str(Path(__file__).parents[1]))

from breakdown import Ping, per_ping, stamps
from breakdown import report as report_breakdown
from versus import report as report_versus

from tests.transports.matrix.matrix_service import service
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer, synapse_python

SYNC_FILTER = {"presence": {"not_types": ["*"]}, "room": {"state": {"lazy_load_members": True}}}


@dataclass
class Arrivals:
    """Message events as the user's long-poll ``/sync`` delivers them, with arrival times."""

    seen: list[tuple[float, str, str, str]] = field(default_factory=list)
    """(arrival, room, sender, body)"""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def first(self, room: str, sender: str, needle: str, after: int) -> float:
        while True:
            for at, room_id, who, body in self.seen[after:]:
                if room_id == room and who == sender and needle in body:
                    return at
            self.changed.clear()
            await self.changed.wait()


RUN_END_PAUSE_S = 0.3
"""Pause after each ping: a chatbridge run ends meanwhile (claude exits, is swept), and
the homeserver is as idle for the next ping whichever bot had the last (until
2026-11-27 only chatbridge's pings waited, and came right after the echo bot's
answer: about 4 ms of the homeserver's work on it fell on chatbridge)."""


def client(synapse: SynapseServer, user: MatrixUser) -> AsyncClient:
    c = AsyncClient(synapse.url, user.user_id, device_id=user.device_id)
    c.restore_login(user.user_id, user.device_id, user.access_token)
    return c


async def sync_loop(c: AsyncClient, arrivals: Arrivals | None, on_message: object = None) -> None:
    """Long-poll forever; record (or answer) every new text message."""
    first = await c.sync(timeout=0, sync_filter=SYNC_FILTER)
    assert isinstance(first, SyncResponse), first
    while True:
        response = await c.sync(timeout=30_000, sync_filter=SYNC_FILTER)
        now = time.monotonic()
        if not isinstance(response, SyncResponse):
            await asyncio.sleep(0.1)
            continue
        for room_id, info in response.rooms.join.items():
            for event in info.timeline.events:
                if isinstance(event, RoomMessageText):
                    if arrivals is not None:
                        arrivals.seen.append((now, room_id, event.sender, event.body))
                    if callable(on_message):
                        await on_message(room_id, event)
        if arrivals is not None:
            arrivals.changed.set()


async def echo_bot(c: AsyncClient) -> None:
    """The baseline: answer every message from someone else with its own text."""

    async def answer(room_id: str, event: RoomMessageText) -> None:
        if event.sender != c.user_id:
            await c.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": event.body})

    await sync_loop(c, None, answer)


async def join_all(c: AsyncClient, rooms: list[str]) -> None:
    for room in rooms:
        await c.join(room)


@asynccontextmanager
async def homeserver(tmp: Path) -> AsyncIterator[SynapseServer]:
    python = synapse_python()
    if python is None:
        raise SystemExit("Synapse is not installed: run `make peers` first")
    server = SynapseServer(python, tmp / "synapse")
    (tmp / "synapse").mkdir()
    server.configure()
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def bench(
    pings: int, coalesce_ms: int, breakdown: bool, prestart: bool, keep_warm: bool = False
) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-ping-") as tmp_name:
        tmp = Path(tmp_name)
        async with homeserver(tmp) as synapse:
            human_user = synapse.register("human")
            bridge_user = synapse.register("bridge")
            echo_user = synapse.register("echo")
            human = client(synapse, human_user)
            echo = client(synapse, echo_user)
            users = Users(human_user, bridge_user, echo_user)
            try:
                timings, rows = await measure(
                    tmp,
                    synapse,
                    users,
                    (human, echo),
                    pings=pings,
                    coalesce_ms=coalesce_ms,
                    breakdown=breakdown,
                    prestart=prestart,
                    keep_warm=keep_warm,
                )
            finally:
                await human.close()
                await echo.close()
    report(timings, coalesce_ms)
    if breakdown:
        report_breakdown(rows)


@dataclass(frozen=True)
class Users:
    human: MatrixUser
    bridge: MatrixUser
    echo: MatrixUser


async def measure(
    tmp: Path,
    synapse: SynapseServer,
    users: Users,
    clients: tuple[AsyncClient, AsyncClient],
    *,
    pings: int,
    coalesce_ms: int,
    breakdown: bool,
    prestart: bool = False,
    keep_warm: bool = False,
) -> tuple[dict[str, list[float]], list[dict[str, float]]]:
    """Join both bots, start chatbridge, then ping each bot ``pings`` times, alternating."""
    human_user, bridge_user, echo_user = users.human, users.bridge, users.echo
    human, echo = clients
    created = await human.room_create(invite=[bridge_user.user_id])
    assert isinstance(created, RoomCreateResponse), created
    bridge_room = created.room_id
    created = await human.room_create(invite=[echo_user.user_id])
    assert isinstance(created, RoomCreateResponse), created
    echo_room = created.room_id
    await join_all(echo, [echo_room])
    work = tmp / "bridge"
    work.mkdir()
    fake_times = tmp / "fake-claude-times.jsonl"
    stage_env = (
        {"CHATBRIDGE_LOGGING__LEVEL": "DEBUG", "FAKE_CLAUDE_TIMES": str(fake_times)}
        if breakdown
        else {}
    )
    async with service(
        work,
        synapse,
        bridge_user,
        bridge_room,
        allowed=(human_user.user_id,),
        claude_env={
            "FAKE_CLAUDE_ECHO": "1",
            "FAKE_CLAUDE_NO_TOOL": "1",
            # The environment overrides the file (as in production).
            "CHATBRIDGE_DISPATCHER__COALESCE_MS": str(coalesce_ms),
            "CHATBRIDGE_MATRIX__SYNC_TIMEOUT_MS": "30000",
            "CHATBRIDGE_RUNNER__PRESTART": "true" if prestart or keep_warm else "false",
            "CHATBRIDGE_RUNNER__PRESTART_KEEP_S": "30" if keep_warm else "0",
            **stage_env,
        },
    ) as running:
        arrivals = Arrivals()
        async with asyncio.TaskGroup() as tasks:
            listener = tasks.create_task(sync_loop(human, arrivals))
            echoing = tasks.create_task(echo_bot(echo))
            # The bridge joins on invite: wait until it answers once.
            await ping(human, arrivals, bridge_room, bridge_user.user_id, limit_s=60)
            await ping(human, arrivals, echo_room, echo_user.user_id, limit_s=60)
            timings: dict[str, list[float]] = {"echo": [], "chatbridge": []}
            marks: list[Ping] = []
            for _ in range(pings):
                # The same pause before every ping: the homeserver is done with the
                # last event (its pushes, its syncs) for either bot alike.
                timings["echo"].append(await ping(human, arrivals, echo_room, echo_user.user_id))
                await asyncio.sleep(RUN_END_PAUSE_S)
                timings["chatbridge"].append(
                    await ping(human, arrivals, bridge_room, bridge_user.user_id, marks=marks)
                )
                # The answer comes on claude's result line, before the run has ended:
                # a ping sent while it ends would join the room's follow-up batch,
                # which starts at the run's end without a window. Let it end first.
                await asyncio.sleep(RUN_END_PAUSE_S)
            listener.cancel()
            echoing.cancel()
        rows = per_ping(marks, stamps(running.log, fake_times)) if breakdown else []
    return timings, rows


async def ping(
    human: AsyncClient,
    arrivals: Arrivals,
    room: str,
    bot: str,
    *,
    limit_s: float = 30,
    marks: list[Ping] | None = None,
) -> float:
    nonce = f"ping {uuid.uuid4().hex[:12]}"
    after = len(arrivals.seen)
    start = time.monotonic()
    await human.room_send(room, "m.room.message", {"msgtype": "m.text", "body": nonce})
    async with asyncio.timeout(limit_s):
        answered = await arrivals.first(room, bot, nonce, after)
    if marks is not None:
        marks.append(Ping(start, answered))
    return (answered - start) * 1000


def report(timings: dict[str, list[float]], coalesce_ms: int) -> None:
    report_versus("ping → answer in the user's /sync", timings, coalesce_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=60)
    parser.add_argument("--coalesce-ms", type=int, default=50)
    parser.add_argument(
        "--breakdown", action="store_true", help="log stage stamps and print where the time goes"
    )
    parser.add_argument(
        "--prestart", action="store_true", help="start claude inside the window ([runner] prestart)"
    )
    parser.add_argument(
        "--keep-warm",
        action="store_true",
        help="also keep the room's next claude warm after each run (prestart_keep_s = 30)",
    )
    args = parser.parse_args()
    asyncio.run(bench(args.pings, args.coalesce_ms, args.breakdown, args.prestart, args.keep_warm))


if __name__ == "__main__":
    main()

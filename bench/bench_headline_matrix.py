"""The headline's Matrix part (run by ``bench_headline.py --matrix``): the real claude
through chatbridge against a bare echo bot on one Synapse, and the first sign of life.

The user's message to the answer in their own ``/sync``, chatbridge and echo
pinged alternately (so the homeserver's costs are the same for both), with
the default window (follows typing, ``idle_ms`` 300; the user sends no typing
notices, as a script would not), the same with ``prestart_keep_s`` 30 (a
claude kept warm: the only way a 300 ms window hides claude's start-up), and
plain windows of 300 and 1500 ms. The
sign of life: the message to the bot's typing as the user's ``/sync``
delivers it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench_headline import SIGN_OF_LIFE_GOAL_MS, SLACK_MS, goal, row
from bench_ping import RUN_END_PAUSE_S, client, echo_bot, homeserver, join_all
from nio import AsyncClient, RoomCreateResponse, RoomMessageText, SyncResponse, TypingNoticeEvent

from tests.fakes.model_server import claude_bin
from tests.transports.matrix.matrix_service import service

SYNC_FILTER = {"presence": {"not_types": ["*"]}, "room": {"state": {"lazy_load_members": True}}}


@dataclass
class Seen:
    """(arrival, room, sender or "typing:" + user) as the user's long-poll delivers them."""

    events: list[tuple[float, str, str]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def first(self, match: Callable[[str, str], bool], after: int) -> float:
        while True:
            for at, room, what in self.events[after:]:
                if match(room, what):
                    return at
            self.changed.clear()
            await self.changed.wait()


async def watch(c: AsyncClient, seen: Seen) -> None:
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
                    seen.events.append((now, room_id, event.sender))
            for ephemeral in info.ephemeral:
                if isinstance(ephemeral, TypingNoticeEvent):
                    for user in ephemeral.users:
                        seen.events.append((now, room_id, "typing:" + user))
        seen.changed.set()


async def ping(
    human: AsyncClient, seen: Seen, room: str, bot: str, n: int
) -> tuple[float, float | None]:
    """(message → answer, message → the bot's typing if it came first) in ms."""
    after = len(seen.events)
    start = time.monotonic()
    await human.room_send(room, "m.room.message", {"msgtype": "m.text", "body": f"ping {n}"})
    async with asyncio.timeout(60):
        answered = await seen.first(lambda r, what: r == room and what == bot, after)
    typed = [at for at, r, what in seen.events[after:] if r == room and what == "typing:" + bot]
    sign = (typed[0] - start) * 1000 if typed and typed[0] <= answered else None
    return (answered - start) * 1000, sign


async def bench_matrix(tmp: Path, claude: dict[str, str], runs: int, turn_p50: float) -> None:
    print(f"Matrix through chatbridge against an echo bot, one Synapse, {runs} pings each")
    async with homeserver(tmp) as synapse:
        human_user = synapse.register("human")
        bridge_user = synapse.register("bridge")
        echo_user = synapse.register("echo")
        human = client(synapse, human_user)
        echo = client(synapse, echo_user)
        try:
            created = await human.room_create(invite=[echo_user.user_id])
            assert isinstance(created, RoomCreateResponse), created
            echo_room = created.room_id
            await join_all(echo, [echo_room])
            cases: tuple[tuple[str, dict[str, str], int], ...] = (
                # The first case after Synapse's start pays for its warming up: a plain
                # window first, to compare the window that follows typing with it fairly.
                ("plain window 300", {"CHATBRIDGE_DEFAULTS__FOLLOW_TYPING": "false"}, 300),
                ("window follows typing (default, idle 300)", {}, 300),
                (
                    "window follows typing, prestart_keep_s 30",
                    {"CHATBRIDGE_RUNNER__PRESTART_KEEP_S": "30"},
                    300,
                ),
                (
                    "plain window 1500",
                    {
                        "CHATBRIDGE_DEFAULTS__FOLLOW_TYPING": "false",
                        "CHATBRIDGE_DISPATCHER__COALESCE_MS": "1500",
                    },
                    1500,
                ),
            )
            for n, (name, extra, window_ms) in enumerate(cases):
                created = await human.room_create(invite=[bridge_user.user_id])
                assert isinstance(created, RoomCreateResponse), created
                room = created.room_id
                work = tmp / f"matrix-{n}"
                work.mkdir()
                env = {
                    "CHATBRIDGE_RUNNER__CLAUDE_BIN": str(claude_bin()),
                    "CHATBRIDGE_DEFAULTS__ENV": json.dumps(claude),
                    "CHATBRIDGE_DEFAULTS__PERMISSION_MODE": "bypassPermissions",
                    "CHATBRIDGE_MATRIX__SYNC_TIMEOUT_MS": "30000",
                    **extra,
                }
                async with service(
                    work, synapse, bridge_user, room, allowed=(human_user.user_id,), claude_env=env
                ):
                    seen = Seen()
                    async with asyncio.TaskGroup() as tasks:
                        watcher = tasks.create_task(watch(human, seen))
                        echoing = tasks.create_task(echo_bot(echo))
                        await ping(human, seen, room, bridge_user.user_id, -1)  # joins, warms
                        await asyncio.sleep(RUN_END_PAUSE_S * 3)
                        echoes, answers, signs = [], [], []
                        for i in range(runs):
                            echoes.append(
                                (await ping(human, seen, echo_room, echo_user.user_id, i))[0]
                            )
                            await asyncio.sleep(RUN_END_PAUSE_S)
                            answer, sign = await ping(human, seen, room, bridge_user.user_id, i)
                            answers.append(answer)
                            if sign is not None:
                                signs.append(sign)
                            await asyncio.sleep(RUN_END_PAUSE_S * 3)
                        watcher.cancel()
                        echoing.cancel()
                print(f" {name}")
                echo50 = row("echo bot", echoes)
                bridge50 = row("chatbridge", answers)
                goal(
                    "above echo: window + turn + 25",
                    bridge50 - echo50,
                    window_ms + turn_p50 + SLACK_MS,
                )
                if signs:
                    print(
                        f"    (the echo bot's answer, the homeserver's round trip: {echo50:.1f} ms)"
                    )
                    row(f"sign of life ({len(signs)} of {runs} before the answer)", signs)
                    cuts = sorted(signs)
                    goal(
                        "sign of life p99",
                        cuts[min(len(cuts) - 1, int(0.99 * len(cuts)))],
                        SIGN_OF_LIFE_GOAL_MS,
                    )
        finally:
            await human.close()
            await echo.close()

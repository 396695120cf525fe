"""Adversarial review of the spare supervisors and of typing cleared after the answer
(bridge/runs.py ``_cosmetics``): the service end to end, with the fake claude."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomKey
from bridge.core.transport import Delivery, RateLimited
from tests.bridge.chat_room import GUARD_S, console_room, serving
from tests.bridge.test_answer_first import Timeline, settings

RETRY_AFTER_S = 60.0
"""Longer than the wait for the answer before the cosmetics (cosmetic_timeout_s)."""


class LimitedAnswer(Timeline):
    """A chat server that answers the first post of the answer with "too many
    requests, retry after a minute" (Matrix's M_LIMIT_EXCEEDED, Slack's 429)."""

    def __init__(self, room: RoomKey, user: str) -> None:
        super().__init__(room, user)
        self.limited = asyncio.Event()
        self.typing: bool | None = None
        """The typing indicator as the room shows it (Matrix renews it until cleared)."""

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        if reply.kind is ReplyKind.RESULT and not self.limited.is_set():
            self.limited.set()
            raise RateLimited(self.name, RETRY_AFTER_S)
        return await super().send(reply, delivery)

    async def set_typing(self, room: RoomKey, typing: bool) -> None:
        self.typing = typing
        await super().set_typing(room, typing)


async def test_typing_goes_off_when_the_answer_is_rate_limited(tmp_path: Path) -> None:
    config = settings(tmp_path, {}, {"FAKE_CLAUDE_RESULT": "the answer"})
    chat = LimitedAnswer(console_room(config), "local")
    async with serving(config, chat) as (service, _):
        service.executor.cosmetic_timeout_s = 0.2
        await chat.say("hi")
        async with asyncio.timeout(GUARD_S):
            await chat.limited.wait()
            await chat.wait_until(lambda: ("typing", "True") in chat.events)
            # The run is over (its cosmetics given up on the answer's wait) ...
            await service.dispatcher.wait_idle()
        # ... and the answer waits for the rate limit to pass: the room must not
        # show the bot typing meanwhile, nor after (Matrix renews it until cleared).
        assert chat.texts(ReplyKind.RESULT) == []
        assert chat.typing is False, chat.events


def standby_children() -> list[int]:
    """Our children that are spare supervisors (``--standby``) still alive."""
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if fields[1] == me and fields[0] != "Z" and b"--standby" in cmdline:
            found.append(int(entry.name))
    return found


async def test_a_service_that_ends_leaves_no_spare(tmp_path: Path) -> None:
    config = settings(tmp_path, {}, {"FAKE_CLAUDE_RESULT": "done"})
    async with serving(config) as (service, chat):
        await chat.say("hi")
        await chat.wait_until(lambda: chat.texts(ReplyKind.RESULT) == ["done"])
        # A spare is ready for the next run (refilled after this one's start).
        async with asyncio.timeout(GUARD_S):
            while service.spares._ready is None:
                await asyncio.sleep(0.05)
        assert standby_children() != []
    assert standby_children() == []

"""A command's answer does not hold up the sink (the transport acknowledges first), and
goes through the outbox: ordered per room, retried under rate limits, never dropped."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bridge.config import load_settings
from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomId, RoomKey, TransportName
from bridge.core.transport import Accepted, Delivery, RateLimited
from bridge.service import Service, open_store
from tests.bridge.chat_room import ChatRoom, serving
from tests.bridge.harness import rows, write_config

SINK_GUARD_S = 10.0
"""Far longer than a sink needs; reached only if it waits for the held answer."""


async def test_the_sink_returns_before_a_slow_answer_and_answers_keep_their_order(
    tmp_path: Path,
) -> None:
    config = {"dispatcher": {"coalesce_ms": 600_000, "max_wait_ms": 600_000}}
    settings = load_settings(write_config(tmp_path, config))
    async with serving(settings) as (service, chat):
        chat.sending.clear()  # the chat server answers nothing until released
        async with asyncio.timeout(SINK_GUARD_S):
            assert (await chat.say("!help"))[1] is Accepted.ACCEPTED
            assert (await chat.say("!status"))[1] is Accepted.ACCEPTED
            # A later message is accepted while the answers are still held.
            assert (await chat.say("hello"))[1] is Accepted.ACCEPTED
        assert chat.replies == []
        assert service.parts.dispatcher.status(chat.room).waiting == 1
        # The commands are settled (done) though their answers are not out yet.
        states = rows(tmp_path, "select text, state from messages order by id")
        assert states == [("!help", "done"), ("!status", "done"), ("hello", "pending")]

        chat.sending.set()
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.NOTICE)) >= 2)
        help_answer, status_answer = chat.texts(ReplyKind.NOTICE)[:2]
        assert help_answer.startswith("Commands:")
        assert status_answer.startswith("Idle.")


class RateLimitedOnce(ChatRoom):
    """The chat server answers the first send with "too many requests, retry at once"."""

    def __init__(self, room: RoomKey, user: str) -> None:
        super().__init__(room, user)
        self.limited = 0

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        if self.limited == 0:
            self.limited += 1
            raise RateLimited(self.name, 0.0)
        return await super().send(reply, delivery)


async def test_a_rate_limited_command_answer_is_sent_again_not_dropped(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    room = RoomKey(TransportName("console"), RoomId(settings.console.room))
    chat = RateLimitedOnce(room, "local")
    store = await open_store(settings)
    try:
        service = Service(settings, store, [chat])
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(service.serve())
            await service.ready.wait()
            await chat.say("!help")
            await chat.wait_until(lambda: len(chat.texts(ReplyKind.NOTICE)) == 1)
            service.request_stop()
            await task
    finally:
        await store.close()
    assert chat.limited == 1
    assert chat.texts(ReplyKind.NOTICE)[0].startswith("Commands:")
    assert rows(tmp_path, "select state from outbox") == [("delivered",)]

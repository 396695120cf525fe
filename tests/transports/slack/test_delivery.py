"""Replies with a Delivery: no part posted twice across retries and restarts.

Against :mod:`tests.transports.slack.fake_slack`, which keeps message metadata (local-slack
drops it) and can carry out a post but lose its answer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomId, RoomKey, TransportName
from bridge.core.transport import Delivery, RateLimited, RoomBinding, TransportError
from tests.transports.slack.fake_slack import CHANNEL, fake_slack
from transports.slack.settings import SlackSettings
from transports.slack.transport import SlackTransport

ROOM = RoomKey(TransportName("slack"), RoomId(CHANNEL))
# Three paragraphs that do not fit together under a 200-character limit.
THREE_PARTS = "\n\n".join(c * 150 for c in "abc")


def transport(api_url: str) -> SlackTransport:
    settings = SlackSettings(
        bot_token="xoxb-x", app_token="xapp-x", api_url=api_url, message_limit=200
    )
    return SlackTransport(settings, [RoomBinding(RoomId(CHANNEL))])


@dataclass
class Outbox:
    """Records parts as the durable outbox would; can fail (crash) after a given part."""

    key: str = "reply-1"
    done: dict[int, ExternalMessageId] = field(default_factory=dict)
    crash_after: int | None = None

    def delivery(self) -> Delivery:
        return Delivery(self.key, len(self.done), self.part_sent)

    async def part_sent(self, index: int, ts: ExternalMessageId) -> None:
        if index == self.crash_after:
            self.crash_after = None
            raise RuntimeError("the process died before recording the part")
        assert index == len(self.done), "parts are reported in order, once"
        self.done[index] = ts


def posted_parts(posted: list[dict[str, object]]) -> list[str]:
    return [str(m["text"])[0] for m in posted]


async def test_parts_are_reported_in_order_and_done_parts_skipped() -> None:
    async with fake_slack() as fake:
        outbox = Outbox()
        slack = transport(fake.api_url)
        last = await slack.outbound.send(
            Reply(ROOM, THREE_PARTS, ReplyKind.RESULT), outbox.delivery()
        )
        again = await slack.outbound.send(
            Reply(ROOM, THREE_PARTS, ReplyKind.RESULT), outbox.delivery()
        )
    assert sorted(outbox.done) == [0, 1, 2]
    assert last == outbox.done[2]
    assert again is None  # nothing left to send
    assert posted_parts(fake.posted) == ["a", "b", "c"]


async def test_a_restart_between_post_and_record_does_not_post_the_part_again() -> None:
    async with fake_slack() as fake:
        outbox = Outbox(crash_after=1)
        reply = Reply(ROOM, THREE_PARTS, ReplyKind.RESULT)
        with pytest.raises(RuntimeError):
            await transport(fake.api_url).outbound.send(reply, outbox.delivery())
        assert sorted(outbox.done) == [0]
        # A new process: it knows nothing of the first attempt.
        await transport(fake.api_url).outbound.send(reply, outbox.delivery())
    assert posted_parts(fake.posted) == ["a", "b", "c"]
    assert outbox.done[1] == fake.posted[1]["ts"]


async def test_a_lost_answer_is_looked_up_before_posting_again() -> None:
    async with fake_slack() as fake:
        slack = transport(fake.api_url)
        outbox = Outbox()
        reply = Reply(ROOM, THREE_PARTS, ReplyKind.RESULT, thread="0.000001")
        fake.lost_answers = 1  # part 0 is posted, but the answer says 500
        with pytest.raises(TransportError):
            await slack.outbound.send(reply, outbox.delivery())
        await slack.outbound.send(reply, outbox.delivery())
    assert posted_parts(fake.posted) == ["a", "b", "c"]
    assert outbox.done[0] == fake.posted[0]["ts"]
    assert fake.calls_to("conversations.replies") == 2  # first sight, then the unknown outcome


async def test_a_rate_limited_part_is_retried_without_another_lookup() -> None:
    async with fake_slack() as fake:
        slack = transport(fake.api_url)
        outbox = Outbox()
        reply = Reply(ROOM, THREE_PARTS, ReplyKind.RESULT)
        fake.rate_limited["chat.postMessage"] = [0, 0]
        for _ in range(2):
            with pytest.raises(RateLimited):
                await slack.outbound.send(reply, outbox.delivery())
        await slack.outbound.send(reply, outbox.delivery())
    assert posted_parts(fake.posted) == ["a", "b", "c"]
    assert fake.calls_to("conversations.history") == 1


async def test_each_part_carries_its_delivery_key_and_index() -> None:
    async with fake_slack() as fake:
        await transport(fake.api_url).outbound.send(
            Reply(ROOM, THREE_PARTS), Outbox("k-7").delivery()
        )
    assert [m["metadata"] for m in fake.posted] == [
        {"event_type": "chatbridge_reply_part", "event_payload": {"key": "k-7", "part": i}}
        for i in range(3)
    ]


async def test_a_part_whose_record_failed_is_looked_up_not_posted_again() -> None:
    """The outbox failed to record part 1 (the database, not a crash); same process retries."""
    async with fake_slack() as fake:
        slack = transport(fake.api_url)
        outbox = Outbox(crash_after=1)
        reply = Reply(ROOM, THREE_PARTS, ReplyKind.RESULT)
        with pytest.raises(RuntimeError):
            await slack.outbound.send(reply, outbox.delivery())
        await slack.outbound.send(reply, outbox.delivery())
    assert posted_parts(fake.posted) == ["a", "b", "c"]
    assert outbox.done[1] == fake.posted[1]["ts"]
    assert fake.calls_to("conversations.history") == 2


async def test_a_post_cancelled_in_flight_is_looked_up_not_posted_again() -> None:
    """Cancelled (an attempt's timeout, shutdown) after Slack carried the post out."""
    async with fake_slack() as fake:
        slack = transport(fake.api_url)
        outbox = Outbox()
        reply = Reply(ROOM, THREE_PARTS, ReplyKind.RESULT)
        fake.stall_post = 1  # part 1 is posted, its answer never comes
        attempt = asyncio.create_task(slack.outbound.send(reply, outbox.delivery()))
        async with asyncio.timeout(10):
            await fake.stalled.wait()
        attempt.cancel()
        with pytest.raises(asyncio.CancelledError):
            await attempt
        await slack.outbound.send(reply, outbox.delivery())
    assert posted_parts(fake.posted) == ["a", "b", "c"]
    assert outbox.done[1] == fake.posted[1]["ts"]


async def test_parts_fit_the_limit_as_sent_after_escaping() -> None:
    """``&`` goes out as ``&amp;``: a part cut to the limit before escaping would not fit."""
    lines = [f"{i} & <b> && <<x>> & {'&' * 20}" for i in range(4000)]
    text = "\n".join(lines)
    async with fake_slack() as fake:
        settings = SlackSettings(
            bot_token="xoxb-x",
            app_token="xapp-x",
            api_url=fake.api_url,
            message_limit=39000,
            upload_threshold=0,
        )
        slack = SlackTransport(settings, [RoomBinding(RoomId(CHANNEL))])
        outbox = Outbox()
        await slack.outbound.send(Reply(ROOM, text, ReplyKind.RESULT), outbox.delivery())
        await slack.outbound.edit(ROOM, ExternalMessageId(str(fake.posted[0]["ts"])), text)
    assert fake.calls_to("chat.postMessage") == len(fake.posted) == len(outbox.done) > 1
    assert all(len(str(m["text"])) <= 39000 for m in fake.posted)
    sent = "\n".join(str(m["text"]) for m in fake.posted)
    assert sent.count("&amp;") == text.count("&")
    assert fake.calls_to("chat.update") == 1

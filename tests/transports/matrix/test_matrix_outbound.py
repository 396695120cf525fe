"""What the bridge sends, read back from a real Synapse: mentions, sizes, idempotent parts,
rate limits."""

from __future__ import annotations

import asyncio
import re

import pytest

from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomId, RoomKey, TransportName
from bridge.core.transport import Delivery, RateLimited
from tests.transports.matrix.matrix_helpers import (
    Human,
    RecordingSink,
    TransportFactory,
    joined,
    running,
)
from tests.transports.matrix.synapse_peer import SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

BOT = "@chatbridge:localhost"


def key(room_id: str) -> RoomKey:
    return RoomKey(TransportName("matrix"), RoomId(room_id))


def prose(paragraphs: int, words: int) -> str:
    return "\n\n".join(f"Paragraph {p}: " + "lorem ipsum " * words for p in range(paragraphs))


def squeezed(text: str) -> str:
    """``text`` without whitespace: splitting may move the blank lines between parts."""
    return re.sub(r"\s+", "", text)


class Recorder:
    """Stands in for the outbox: records the parts a delivery reports."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.sent: dict[int, ExternalMessageId] = {}
        self._fail_at = fail_at

    async def part_sent(self, index: int, event_id: ExternalMessageId) -> None:
        if index == self._fail_at:
            self._fail_at = None
            raise RuntimeError("the bridge died before recording this part")
        self.sent[index] = event_id

    def delivery(self, key: str) -> Delivery:
        return Delivery(key, len(self.sent), self.part_sent)


async def test_an_event_that_could_notify_declares_that_it_mentions_no_one(
    alice: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT])
    transport = make_transport([room])
    async with running(transport, RecordingSink()):
        await alice.wait_for(joined(BOT, room))
        await transport.outbound.send(Reply(key(room), "done, @room: see above", ReplyKind.RESULT))
        await transport.outbound.send(Reply(key(room), "ask ALICE about it", ReplyKind.NOTICE))
        await transport.outbound.send(Reply(key(room), "all done", ReplyKind.RESULT))
        progress = await transport.outbound.send(Reply(key(room), "working…", ReplyKind.PROGRESS))
        assert progress is not None
        await transport.outbound.edit(key(room), progress, "working… @room")
        await alice.wait_for(lambda s: "m.new_content" in s.content)
    sent = [s.content for s in alice.seen if s.source.get("sender") == BOT and s.room_id == room]
    messages = [c for c in sent if "msgtype" in c]
    assert [c["body"] for c in messages] == [
        "done, @room: see above",
        "ask ALICE about it",
        "all done",
        "working…",
        "* working… @room",
    ]
    # A name of the room's (any case) or an "@room": declared; no such text: not.
    assert ["m.mentions" in c for c in messages] == [True, True, False, False, True]
    assert all(c["m.mentions"] == {} for c in messages if "m.mentions" in c)
    assert messages[-1]["m.new_content"]["m.mentions"] == {}


async def test_the_bots_events_highlight_no_one_with_or_without_the_declaration(
    synapse: SynapseServer, alice: Human, mallory: Human, make_transport: TransportFactory
) -> None:
    """Read back from the homeserver's own push rules: mallory's name in an answer (so
    declared) highlights nobody, nor does an answer without a name (not declared);
    alice writing the name without a declaration does: the legacy rules are on."""
    room = await alice.create_room([BOT, mallory.user.user_id])
    transport = make_transport([room])
    async with running(transport, RecordingSink()):
        await mallory.join(room)
        await alice.wait_for(joined(BOT, room))
        await alice.wait_for(joined(mallory.user.user_id, room))
        await transport.outbound.send(
            Reply(key(room), "mallory: the build is green", ReplyKind.RESULT)
        )
        await transport.outbound.send(Reply(key(room), "the build is green", ReplyKind.RESULT))
        await alice.client.room_send(
            room, "m.room.message", {"msgtype": "m.text", "body": "mallory: look"}
        )
        await mallory.wait_for(lambda s: s.content.get("body") == "mallory: look")
    highlighted = await mallory.highlights(room)
    assert highlighted == ["mallory: look"]


async def test_a_long_answer_in_an_encrypted_room_is_split_to_fit_after_encryption(
    alice: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT], encrypted=True)
    # One part per event as far as the characters go: only the size limit splits.
    transport = make_transport([room], max_event_chars=200_000)
    text = prose(40, 60)  # ~29 KB: Markdown and HTML together ~60 KB, encrypted ~80 KB
    async with running(transport, RecordingSink()):
        await alice.wait_for(joined(BOT, room))
        await alice.sync()
        last = await transport.outbound.send(Reply(key(room), text, ReplyKind.RESULT))
        await alice.wait_for(lambda s: s.source.get("event_id") == last)
    parts = [s for s in alice.seen if s.source.get("sender") == BOT and "body" in s.content]
    assert len(parts) >= 2
    assert all(getattr(p.event, "decrypted", False) for p in parts)
    assert squeezed("".join(p.content["body"] for p in parts)) == squeezed(text)


async def test_parts_already_delivered_are_skipped_and_a_resent_part_posts_once(
    alice: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT], encrypted=True)
    transport = make_transport([room], max_event_chars=1_000)
    text = prose(6, 60)  # six parts
    reply = Reply(key(room), text, ReplyKind.RESULT)
    outbox = Recorder(fail_at=3)
    async with running(transport, RecordingSink()):
        await alice.wait_for(joined(BOT, room))
        await alice.sync()
        # Part 3 is posted, but the bridge "crashes" before recording it ...
        with pytest.raises(RuntimeError, match="before recording"):
            await transport.outbound.send(reply, outbox.delivery("answer-1"))
        assert sorted(outbox.sent) == [0, 1, 2]
        # ... so the next attempt sends part 3 again, with the same transaction id.
        last = await transport.outbound.send(reply, outbox.delivery("answer-1"))
        assert sorted(outbox.sent) == list(range(6))
        await alice.wait_for(lambda s: s.source.get("event_id") == last)
    parts = [s for s in alice.seen if s.source.get("sender") == BOT and "body" in s.content]
    assert [p.source["event_id"] for p in parts] == [outbox.sent[i] for i in range(6)]
    assert squeezed("".join(p.content["body"] for p in parts)) == squeezed(text)


async def test_a_rate_limited_answer_is_delivered_whole_by_retrying(
    synapse: SynapseServer, alice: Human, make_transport: TransportFactory
) -> None:
    admin = synapse.register("ratelimit-admin", admin=True)
    bot = synapse.register("ratelimited-bot")
    # Synapse's default rc_message is 0.2/s with a burst of 10; this is as strict.
    synapse.limit_messages(admin, bot, per_second=2, burst=4)
    room = await alice.create_room([bot.user_id])
    transport = make_transport(
        [room], user_id=bot.user_id, password=bot.password, max_event_chars=1_000
    )
    text = prose(16, 70)
    reply = Reply(key(room), text, ReplyKind.RESULT)
    outbox = Recorder()
    waits: list[float] = []
    async with running(transport, RecordingSink()):
        await alice.wait_for(joined(bot.user_id, room))
        last = None
        while last is None:
            try:
                last = await transport.outbound.send(reply, outbox.delivery("answer-16"))
            except RateLimited as limited:
                waits.append(limited.retry_after_s)
                # What the outbox does: wait as long as the server asked.
                await asyncio.sleep(limited.retry_after_s)
    parts = await alice.history(room, bot.user_id)
    assert len(parts) == len(outbox.sent) == 16
    assert all(len(p["content"]["body"]) <= 1_000 for p in parts)
    assert [p["event_id"] for p in parts] == [outbox.sent[i] for i in range(16)]
    assert waits
    assert all(w > 0 for w in waits)

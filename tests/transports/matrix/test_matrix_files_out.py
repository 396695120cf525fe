"""Files posted to Matrix, read back from a real Synapse: ``send_file`` in a plain and
an encrypted room, and a long answer posted as a Markdown file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nio import MemoryDownloadResponse
from nio.crypto.attachments import decrypt_attachment

from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomId, RoomKey, TransportName
from bridge.core.transport import Delivery
from tests.transports.matrix.matrix_helpers import (
    Human,
    RecordingSink,
    TransportFactory,
    joined,
    running,
)

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

BOT = "@chatbridge:localhost"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8


def key(room_id: str) -> RoomKey:
    return RoomKey(TransportName("matrix"), RoomId(room_id))


async def downloaded(alice: Human, content: dict[str, Any]) -> bytes:
    """The file an event carries, decrypted if it is encrypted."""
    encrypted = content.get("file")
    mxc = encrypted["url"] if encrypted else content["url"]
    response = await alice.client.download(mxc=mxc)
    assert isinstance(response, MemoryDownloadResponse), response
    body: bytes = response.body
    if not encrypted:
        return body
    plain: bytes = decrypt_attachment(
        body, encrypted["key"]["k"], encrypted["hashes"]["sha256"], encrypted["iv"]
    )
    return plain


class Parts:
    def __init__(self) -> None:
        self.sent: dict[int, ExternalMessageId] = {}

    async def part_sent(self, index: int, event_id: ExternalMessageId) -> None:
        self.sent[index] = event_id

    def delivery(self, key: str) -> Delivery:
        return Delivery(key, len(self.sent), self.part_sent)


@pytest.mark.parametrize("encrypted", [False, True])
async def test_a_sent_file_arrives_with_its_caption(
    alice: Human, make_transport: TransportFactory, tmp_path: Path, encrypted: bool
) -> None:
    room = await alice.create_room([BOT], encrypted=encrypted)
    transport = make_transport([room])
    copy = tmp_path / "copy" / "chart.png"
    copy.parent.mkdir()
    copy.write_bytes(PNG)
    async with running(transport, RecordingSink()):
        await alice.wait_for(joined(BOT, room))
        await alice.sync()
        question = await alice.send(room, "draw a chart")
        reply = Reply(
            key(room),
            "Here is the chart, @room",
            ReplyKind.RESULT,
            in_reply_to=ExternalMessageId(question),
            file=str(copy),
        )
        event_id = await transport.outbound.send_file(reply, "cbf-1")
        seen = await alice.wait_for(lambda s: s.source.get("event_id") == event_id)
    content = seen.content
    assert getattr(seen.event, "decrypted", False) is encrypted
    assert content["msgtype"] == "m.image"
    assert content["filename"] == "chart.png"
    assert content["body"] == "Here is the chart, @room"
    assert content["m.mentions"] == {}
    assert content["info"] == {"mimetype": "image/png", "size": len(PNG)}
    assert content["m.relates_to"] == {"m.in_reply_to": {"event_id": question}}
    assert ("file" in content) is encrypted
    assert ("url" in content) is not encrypted
    assert await downloaded(alice, content) == PNG


async def test_a_file_without_a_comment_is_named_by_its_body(
    alice: Human, make_transport: TransportFactory, tmp_path: Path
) -> None:
    room = await alice.create_room([BOT])
    transport = make_transport([room])
    copy = tmp_path / "@room notes.txt"
    copy.write_text("plain notes")
    async with running(transport, RecordingSink()):
        await alice.wait_for(joined(BOT, room))
        event_id = await transport.outbound.send_file(Reply(key(room), "", file=str(copy)), "cbf-2")
        seen = await alice.wait_for(lambda s: s.source.get("event_id") == event_id)
    assert seen.content["msgtype"] == "m.file"
    assert seen.content["body"] == "@room notes.txt"
    # The name is the body, and pings no one: the bot declares it mentions nobody.
    assert seen.content["m.mentions"] == {}
    assert seen.content["info"]["mimetype"] == "text/plain"
    assert await downloaded(alice, seen.content) == b"plain notes"


@pytest.mark.parametrize("encrypted", [False, True])
async def test_a_long_answer_is_posted_once_as_a_markdown_file(
    alice: Human, make_transport: TransportFactory, encrypted: bool
) -> None:
    room = await alice.create_room([BOT], encrypted=encrypted)
    transport = make_transport([room], answer_file_chars=2_000)
    text = "# Report\n\n" + "a line of the answer\n" * 500
    reply = Reply(key(room), text, ReplyKind.RESULT)
    parts = Parts()
    async with running(transport, RecordingSink()):
        await alice.wait_for(joined(BOT, room))
        await alice.sync()
        event_id = await transport.outbound.send(reply, parts.delivery("answer-9"))
        # Delivered and recorded: a retry of the same delivery posts nothing.
        assert await transport.outbound.send(reply, parts.delivery("answer-9")) is None
        short = await transport.outbound.send(Reply(key(room), "short answer", ReplyKind.RESULT))
        await alice.wait_for(lambda s: s.source.get("event_id") == short)
    assert parts.sent == {0: event_id}
    from_bot = [s for s in alice.seen if s.source.get("sender") == BOT and "msgtype" in s.content]
    assert [s.source["event_id"] for s in from_bot] == [event_id, short]
    content = from_bot[0].content
    assert content["msgtype"] == "m.file"
    assert content["filename"] == "answer.md"
    assert "attached as a file" in content["body"]
    assert content["info"]["mimetype"] == "text/markdown"
    assert await downloaded(alice, content) == text.encode()
    assert from_bot[1].content["msgtype"] == "m.text"  # under the threshold: a message

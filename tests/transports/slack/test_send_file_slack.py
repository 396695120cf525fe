"""A file claude sends (``send_file``), posted by the Slack transport to local-slack."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.core.model import ExternalMessageId, Reply, ReplyKind, RoomId, RoomKey, TransportName
from tests.transports.slack import peer
from tests.transports.slack.harness import running

pytestmark = pytest.mark.slack

ROOM = RoomKey(TransportName("slack"), RoomId(peer.CHANNEL))


async def test_a_file_is_uploaded_into_the_batch_thread(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40  # binary, not text
    copy = tmp_path / "copy" / "chart.png"
    copy.parent.mkdir()
    copy.write_bytes(data)
    async with running(tmp_path, "socket") as env:
        first = await env.slack.post_message(peer.ALICE, "draw me a chart")
        reply = Reply(
            ROOM,
            "Here is the *chart* <!here>",
            ReplyKind.RESULT,
            ExternalMessageId(first),
            anchor=ExternalMessageId(first),
            file=str(copy),
        )
        posted_id = await env.transport.outbound.send_file(reply, "cbf-key")
        posted = await env.slack.bot_messages()
    [message] = posted
    assert message["ts"] == posted_id
    assert message["thread_ts"] == first
    [file] = message["files"]
    assert file["name"] == "chart.png"
    assert file["size"] == len(data)
    # The comment, rendered and escaped like any text: no broadcast.
    assert message["text"] == "Here is the _chart_ &lt;!here&gt;"
    stored = [p for p in (tmp_path / "local-slack-files").rglob("*") if p.is_file()]
    assert any(p.read_bytes() == data for p in stored)

"""Encrypted messages whose key reaches the bridge late, against a real Synapse.

The bridge's device is created after alice's client shared its Megolm session
with the devices it knew (alice's and the bot account's other device), so the
bridge receives a message it cannot read. That other device can forward the
key when asked, as a user's own second client does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.transports.matrix.matrix_helpers import (
    Human,
    RecordingSink,
    TransportFactory,
    message_from,
    running,
)

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

BOT = "@chatbridge:localhost"


async def room_whose_key_the_bridge_lacks(alice: Human, bot_client: Human) -> str:
    room = await alice.create_room([BOT], encrypted=True)
    await bot_client.join(room)
    await alice.sync()
    # Alice's session goes to the devices she knows now; the bridge's comes later.
    await alice.send(room, "before the bridge")
    return room


async def test_an_unreadable_message_is_kept_and_the_room_told(
    alice: Human, bot_client: Human, make_transport: TransportFactory, tmp_path: Path
) -> None:
    room = await room_whose_key_the_bridge_lacks(alice, bot_client)
    sink = RecordingSink()
    async with running(make_transport([room], undecryptable_notice_s=0), sink):
        secret = await alice.send(room, "secret")
        notice = await alice.wait_for(message_from(BOT, room))
    assert notice.content["msgtype"] == "m.notice"
    assert "could not read a message from @alice:localhost" in notice.content["body"]
    assert sink.messages == []
    # Kept for its key, across restarts.
    kept = json.loads((tmp_path / "bridge-store" / "undecryptable.json").read_text())
    assert [k["source"]["event_id"] for k in kept] == [secret]

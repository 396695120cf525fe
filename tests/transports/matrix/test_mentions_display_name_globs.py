"""Review 4: a member's display name that Synapse's legacy rules read as a glob.

Synapse (rust/src/push/utils.rs ``get_glob_matcher``) treats a member's display
name as a *glob* in ``.m.rule.contains_display_name``: ``*`` and ``?`` are
wildcards, so a member named ``B?b`` or ``*`` is highlighted by an answer that
says "Bob" (or anything at all) unless it declares ``m.mentions``. Found
comparing names as literal substrings; such a name now always counts.
"""

from __future__ import annotations

import asyncio

import pytest
from nio import MatrixRoom, RoomMemberEvent

from bridge.core.model import Reply, ReplyKind, RoomId, RoomKey, TransportName
from tests.transports.matrix.matrix_helpers import (
    Human,
    RecordingSink,
    TransportFactory,
    joined,
    running,
)
from tests.transports.matrix.synapse_peer import SynapseServer
from transports.matrix.mentions import must_declare

BOT = "@chatbridge:localhost"


def member_room(display_name: str) -> MatrixRoom:
    r = MatrixRoom("!r:localhost", BOT)
    r.add_member(BOT, "Chatbridge Bot", None)
    r.add_member("@mallory:localhost", display_name, None)
    return r


@pytest.mark.parametrize(
    ("display_name", "text"),
    [
        ("B?b", "Bob: the build is green"),  # ? is any one character to Synapse
        ("*", "all done"),  # * matches every body: every answer highlights them
        ("Al*", "ask Alice"),
    ],
)
def test_a_glob_display_name_that_synapse_matches_is_declared(display_name: str, text: str) -> None:
    """Found in review round 4."""
    assert must_declare(text, member_room(display_name), BOT)


@pytest.mark.synapse
@pytest.mark.slow
async def test_a_member_named_with_a_wildcard_is_highlighted_by_an_undeclared_answer(
    synapse: SynapseServer, alice: Human, mallory: Human, make_transport: TransportFactory
) -> None:
    """Found in review round 4."""
    room = await alice.create_room([BOT, mallory.user.user_id])
    transport = make_transport([room])
    mallory_id = mallory.user.user_id
    async with running(transport, RecordingSink()):
        await mallory.join(room)
        await alice.wait_for(joined(BOT, room))
        await alice.wait_for(joined(mallory_id, room))
        # A per-room display name (this room's state only).
        # The bot must know the new name before it answers: it learns it from its sync.
        renamed = asyncio.Event()
        client = transport.outbound.client
        assert client is not None

        async def seen(_room: MatrixRoom, event: RoomMemberEvent) -> None:
            if event.state_key == mallory_id and event.content.get("displayname") == "B?b":
                renamed.set()

        client.add_event_callback(seen, RoomMemberEvent)
        await mallory.client.room_put_state(
            room,
            "m.room.member",
            {"membership": "join", "displayname": "B?b"},
            state_key=mallory_id,
        )
        async with asyncio.timeout(30):
            await renamed.wait()
        await transport.outbound.send(
            Reply(
                RoomKey(TransportName("matrix"), RoomId(room)),
                "Bob: the build is green",
                ReplyKind.RESULT,
            )
        )
        await mallory.wait_for(lambda s: s.content.get("body") == "Bob: the build is green")
    sent = [s.content for s in mallory.seen if s.source.get("sender") == BOT and s.room_id == room]
    # Declared: the name is a pattern that may match the text.
    assert [("m.mentions" in c) for c in sent if c.get("body") == "Bob: the build is green"] == [
        True
    ]
    highlighted = await mallory.highlights(room)
    # The answer names no member literally, and Synapse would match "B?b": no one.
    assert highlighted == []

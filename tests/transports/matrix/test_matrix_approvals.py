"""Approval requests and reactions against a real Synapse, plain and encrypted rooms."""

from __future__ import annotations

import pytest

from bridge.core.model import ExternalMessageId, Reply, RoomId, RoomKey, TransportName, UserId
from bridge.core.transport import ApprovalAction, ApprovalChoice
from tests.transports.matrix.matrix_helpers import (
    Human,
    RecordingSink,
    TransportFactory,
    joined,
    running,
)
from tests.transports.matrix.reactions import BOT, offered, react, reaction_of
from transports.matrix.approvals import MARKER

pytestmark = [pytest.mark.synapse, pytest.mark.slow]


def key(room_id: str) -> RoomKey:
    return RoomKey(TransportName("matrix"), RoomId(room_id))


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
async def test_a_reaction_on_a_request_reaches_the_sink(
    alice: Human, make_transport: TransportFactory, encrypted: bool
) -> None:
    room = await alice.create_room([BOT], encrypted=encrypted)
    sink = RecordingSink()
    transport = make_transport([room])
    async with running(transport, sink):
        await alice.wait_for(joined(BOT, room))
        await alice.sync()  # learn the bot's device before encrypting to it
        own = await alice.send(room, "a message of alice's")
        await sink.wait_for_text("a message of alice's")
        request = await transport.outbound.post_approval(
            Reply(key(room), "Claude wants to run **Bash**: `ls`"), "#1"
        )
        assert request is not None
        shown = await alice.wait_for(lambda s: s.source.get("event_id") == request)
        assert shown.content[MARKER] == {"ref": "#1", "kind": "tool"}
        assert "React ✅" in shown.content["body"]
        assert await offered(alice, request) == ["✅", "🔁", "❌"]
        # Not answers: a ✅ on a message that is no request, another emoji.
        await react(alice, room, own, "✅", encrypt=encrypted)
        await react(alice, room, request, "👍", encrypt=encrypted)
        await react(alice, room, request, "🔁", encrypt=encrypted)
        wanted = ApprovalAction(
            key(room),
            UserId(alice.user.user_id),
            ExternalMessageId(request),
            ApprovalChoice.ALLOW_SESSION,
        )
        await sink.wait_for_event(wanted)
        actions = [e for e in sink.events if isinstance(e, ApprovalAction)]
        assert actions == [wanted]  # the bot's own three reactions are not answers


async def test_a_reaction_after_a_restart_is_recognised_and_closing_takes_the_reactions_back(
    alice: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT])
    first = make_transport([room])
    async with running(first, RecordingSink()):
        await alice.wait_for(joined(BOT, room))
        request = await first.outbound.post_approval(
            Reply(key(room), "Claude wants to edit a file"), "#2"
        )
        assert request is not None
        await offered(alice, request)
    sink = RecordingSink()
    second = make_transport([room])  # a restart: nothing of the request is remembered
    async with running(second, sink):
        await react(alice, room, request, "❌")
        wanted = ApprovalAction(
            key(room), UserId(alice.user.user_id), ExternalMessageId(request), ApprovalChoice.DENY
        )
        await sink.wait_for_event(wanted)
        # Closing edits the request into its outcome.
        await second.outbound.close_approval(
            key(room), ExternalMessageId(request), "❌ denied by alice"
        )
        edit = await alice.wait_for(
            lambda s: (
                (s.content.get("m.relates_to") or {}).get("event_id") == request
                and s.content.get("m.relates_to", {}).get("rel_type") == "m.replace"
            )
        )
        assert edit.content["m.new_content"]["body"] == "❌ denied by alice"


async def test_closing_a_request_takes_the_bots_reactions_back(
    alice: Human, make_transport: TransportFactory
) -> None:
    room = await alice.create_room([BOT])
    transport = make_transport([room])
    async with running(transport, RecordingSink()):
        await alice.wait_for(joined(BOT, room))
        request = await transport.outbound.post_approval(
            Reply(key(room), "Claude wants to fetch"), "#3"
        )
        assert request is not None
        reactions = [
            s.source["event_id"] for s in await alice.wait_for_all(reaction_of(BOT, request), 3)
        ]
        await transport.outbound.close_approval(
            key(room), ExternalMessageId(request), "✅ allowed by alice"
        )
        redacted = await alice.wait_for_all(
            lambda s: s.source.get("type") == "m.room.redaction" and s.source.get("sender") == BOT,
            3,
        )
        # Synapse puts "redacts" at the top level (and in content from room v11 on).
        taken = sorted(str(s.source.get("redacts") or s.content.get("redacts")) for s in redacted)
        assert taken == sorted(reactions)

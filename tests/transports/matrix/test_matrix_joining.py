"""Against Synapse: the first messages of a room the bot was just invited to, joins
the server refuses for a while, and one message the service cannot take."""

from __future__ import annotations

import pytest

from bridge.core.transport import Accepted, InboundEvent
from tests.transports.matrix.matrix_helpers import (
    Human,
    RecordingSink,
    TransportFactory,
    joined,
    running,
)
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

BOT = "@chatbridge:localhost"


async def test_a_message_typed_right_after_inviting_the_bot_is_delivered(
    alice: Human, make_transport: TransportFactory
) -> None:
    """Opening a DM with the bot and typing at once: the message predates the bot's join."""
    room = await alice.create_room([])
    sink = RecordingSink()
    async with running(make_transport([room]), sink):
        invited = await alice.client.room_invite(room, BOT)
        assert not hasattr(invited, "status_code"), invited
        first = await alice.send(room, "are you there?")
        await alice.wait_for(joined(BOT, room))
        second = await alice.send(room, "second")
        await sink.wait_for_text("second")
    assert [m.external_id for m in sink.messages] == [first, second]


async def test_a_message_sent_while_the_invited_bot_was_down_is_delivered(
    alice: Human, make_transport: TransportFactory
) -> None:
    async with running(make_transport([]), RecordingSink()):
        pass  # the bridge has a sync position: this is a restart
    before = await alice.create_room([])
    await alice.send(before, "history from before the invite")
    room = await alice.create_room([])
    await alice.send(room, "history from before the invite")
    invited = await alice.client.room_invite(room, BOT)
    assert not hasattr(invited, "status_code"), invited
    first = await alice.send(room, "are you there?")
    sink = RecordingSink()
    async with running(make_transport([room]), sink):
        await alice.wait_for(joined(BOT, room))
        second = await alice.send(room, "second")
        await sink.wait_for_text("second")
    assert [m.external_id for m in sink.messages] == [first, second]


async def test_a_rate_limited_join_is_tried_again(
    synapse: SynapseServer, alice: Human, make_transport: TransportFactory
) -> None:
    admin = synapse.register("joins-admin", admin=True)
    bot = synapse.register("joins-bot")
    # The per-user override governs the join limiter too: one join, then a wait.
    synapse.limit_messages(admin, bot, per_second=1, burst=1)
    account = {"user_id": bot.user_id, "password": bot.password}
    async with running(make_transport([], **account), RecordingSink()):
        pass  # the first start only takes the position
    rooms = [await alice.create_room([bot.user_id]) for _ in range(3)]
    sink = RecordingSink()
    async with running(make_transport(rooms, **account), sink, timeout=60):
        for room in rooms:
            await alice.wait_for(joined(bot.user_id, room))
        await alice.send(rooms[-1], "hello")
        await sink.wait_for_text("hello")


class RefusingSink(RecordingSink):
    """A service whose store cannot take one particular message."""

    def __init__(self, refuse: str) -> None:
        super().__init__()
        self.refuse = refuse

    async def __call__(self, event: InboundEvent) -> Accepted:
        if getattr(event, "text", None) == self.refuse:
            raise ValueError("the store refuses this message")
        return await super().__call__(event)


async def test_one_message_the_service_cannot_take_does_not_block_the_others(
    alice: Human, mallory: Human, make_transport: TransportFactory, bot: MatrixUser
) -> None:
    room = await alice.create_room([BOT, mallory.user.user_id])
    await mallory.join(room)
    other = await alice.create_room([BOT])
    sink = RefusingSink("cannot be stored")
    async with running(make_transport([room, other]), sink, timeout=60):
        await alice.wait_for(joined(BOT, room))
        await alice.wait_for(joined(BOT, other))
        await mallory.send(room, "cannot be stored")
        await alice.send(room, "legit question")
        await alice.send(other, "in another room")
        await sink.wait_for_text("legit question")
        await sink.wait_for_text("in another room")
    assert "cannot be stored" not in sink.texts()

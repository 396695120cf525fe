"""Windows that follow typing, and the sign of life: ``chatbridge run`` with the fake
claude against the test Synapse, alice typing through her client (``m.typing``).

The plain window is made too long to ever close within a test (``coalesce_ms``
and ``max_wait_ms`` of 10 minutes): an answer that comes at all came from a
window that followed typing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from nio import RoomRedactResponse, RoomTypingResponse

from tests.transports.matrix.matrix_helpers import Human, Seen, joined
from tests.transports.matrix.matrix_service import service
from tests.transports.matrix.seen import ALICE, ECHO, answer_in, notice_in, typing_in
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

LAPSE_S = 30.0
"""A typing notice the bot does not clear lapses after this long (the transport's
``typing_refresh_s`` 20 s, times 1.5)."""
NEVER = {"dispatcher": {"coalesce_ms": 600_000, "max_wait_ms": 600_000}}


def bot_typing(bot: MatrixUser, room: str) -> Callable[[Seen], bool]:
    return typing_in(bot, room, on=True)


async def typing(human: Human, room: str, on: bool) -> None:
    response = await human.client.room_typing(room, on, timeout=60_000)
    assert isinstance(response, RoomTypingResponse), response


def cleared_after(human: Human, bot: MatrixUser, room: str, seen: Seen) -> Callable[[Seen], bool]:
    """The bot's typing shown cleared in an event ``human`` saw after ``seen``."""
    at = next(n for n, earlier in enumerate(human.seen) if earlier is seen)

    def match(later: Seen) -> bool:
        after = any(s is later for s in human.seen[at + 1 :])
        return after and typing_in(bot, room, on=False)(later)

    return match


async def test_a_burst_typed_in_pieces_is_one_run_held_open_while_its_sender_types(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    # idle 300 ms (the default): shorter than the exchange below, which only typing
    # holds the window through; longer than the moment between a message and the
    # typing list of the same sync response, which the bridge hands over after it.
    held = {"idle_ms": 300}
    async with service(
        tmp_path,
        synapse,
        bot,
        room,
        allowed=(ALICE,),
        claude_env=ECHO,
        room_extra=held,
        extra=NEVER,
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await typing(alice, room, True)
        await alice.send(room, "alpha")
        # The sign of life: the bot types while the window is still open.
        await alice.wait_for(bot_typing(bot, room))
        await alice.send(room, "!status")
        status = await alice.wait_for(notice_in(bot, room, "waiting:"))
        await alice.send(room, "beta")
        await typing(alice, room, False)  # the burst is over: the window closes now
        answer = await alice.wait_for(answer_in(bot, room))
    assert "running" not in status.content["body"].lower()
    assert "alpha" in answer.content["body"]
    assert "beta" in answer.content["body"]
    answers = [s for s in alice.seen if answer_in(bot, room)(s)]
    assert len(answers) == 1


async def test_a_single_message_closes_its_window_after_idle_ms_and_its_sign_of_life_clears(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    async with service(
        tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=ECHO, extra=NEVER
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "just one")
        await alice.wait_for(bot_typing(bot, room))  # the sign of life
        answer = await alice.wait_for(answer_in(bot, room))
        # Cleared with the run's outcome, after the answer (never in front of it).
        await alice.wait_for(cleared_after(alice, bot, room, answer), timeout=LAPSE_S / 3)
    assert "just one" in answer.content["body"]


async def test_a_room_with_follow_typing_off_keeps_the_plain_window_and_no_sign_of_life(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    plain = {"follow_typing": False, "sign_of_life": False}
    async with service(
        tmp_path,
        synapse,
        bot,
        room,
        allowed=(ALICE,),
        claude_env=ECHO,
        room_extra=plain,
        extra=NEVER,
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "waits for the plain window")
        await alice.send(room, "!status")
        status = await alice.wait_for(notice_in(bot, room, "waiting:"))
        # !stop answers once the message is dropped: the window was still open.
        await alice.send(room, "!stop")
        await alice.wait_for(notice_in(bot, room, "dropped"))
    assert "running" not in status.content["body"].lower()
    assert not [s for s in alice.seen if answer_in(bot, room)(s)]
    assert not [s for s in alice.seen if bot_typing(bot, room)(s)]


@pytest.mark.parametrize("how", ["!stop", "deleted"])
async def test_a_waiting_message_that_will_never_run_clears_its_sign_of_life(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human, how: str
) -> None:
    """Dropped by ``!stop``, or the only one waiting and deleted: its sign of life
    ends then, not when it lapses (LAPSE_S), since nothing will answer."""
    room = await alice.create_room([bot.user_id])
    async with service(
        tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=ECHO, extra=NEVER
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await typing(alice, room, True)  # holds the window open: the message waits
        waiting = await alice.send(room, "never runs")
        shown = await alice.wait_for(bot_typing(bot, room))  # the sign of life
        if how == "!stop":
            await alice.send(room, "!stop")
            await alice.wait_for(notice_in(bot, room, "dropped 1"))
        else:
            redacted = await alice.client.room_redact(room, waiting)
            assert isinstance(redacted, RoomRedactResponse), redacted
        await alice.wait_for(cleared_after(alice, bot, room, shown), timeout=LAPSE_S / 3)
    assert not [s for s in alice.seen if answer_in(bot, room)(s)]

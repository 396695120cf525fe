"""A quick run in a Matrix room posts its answer alone: one message, no status notice.

``[progress] show_after_s`` (default 3 s) keeps the "Working…" notice back until
a run has lasted that long; the fake claude answers at once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.transports.matrix.matrix_helpers import Human, joined, message_from
from tests.transports.matrix.matrix_service import service
from tests.transports.matrix.seen import ALICE, ECHO, answer_in, notice_in
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]


async def test_a_quick_run_posts_one_message(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    async with service(tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=ECHO):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "quick one")
        await alice.wait_for(answer_in(bot, room))
        # A status message could only have come before the answer (none is
        # posted once the answer exists); this notice bounds what is looked at.
        await alice.send(room, "!status")
        await alice.wait_for(notice_in(bot, room, "waiting:"))
    posted = [s.content for s in alice.seen if message_from(bot.user_id, room)(s)]
    assert [c.get("msgtype") for c in posted] == ["m.text", "m.notice"]
    assert "quick one" in posted[0]["body"]
    assert not any("m.new_content" in c for c in posted)  # no edit of a status message


HOSTILE_ROW = (
    "| <script>alert(1)</script> | @room <img src=x onerror=alert(1)> [x](javascript:alert(1)) |\n"
)


async def test_a_long_hostile_quick_answer_is_its_chunks_only_and_safe(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    text = "| a | b |\n|---|---|\n" + HOSTILE_ROW * 500 + "\n\nEND-MARKER"
    # Posted as events, not as a file (answer_file_chars): the chunks are what is tested.
    no_file = {"answer_file_chars": 0}
    async with service(
        tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=ECHO, matrix_extra=no_file
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, text)
        await alice.wait_for(
            lambda s: message_from(bot.user_id, room)(s) and "END-MARKER" in str(s.content["body"])
        )
        await alice.send(room, "!status")
        await alice.wait_for(notice_in(bot, room, "waiting:"))
    posted = [s.content for s in alice.seen if message_from(bot.user_id, room)(s)]
    kinds = [c.get("msgtype") for c in posted]
    assert kinds[-1] == "m.notice"
    assert set(kinds[:-1]) == {"m.text"}
    assert len(posted) > 2  # the answer was split: chunks, then the notice
    assert not any("m.new_content" in c for c in posted)
    for content in posted:
        html = str(content.get("formatted_body", ""))
        assert not re.search(r"<(script|img)|href=\"javascript", html), html[:300]
        # Its "@room" notifies no one: declared (transports.matrix.mentions).
        if "@room" in str(content["body"]):
            assert content.get("m.mentions") == {}
    assert sum("@room" in str(c["body"]) for c in posted) >= 2


async def test_a_failed_quick_run_posts_one_message(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    env = {**ECHO, "FAKE_CLAUDE_EXIT": "3"}
    async with service(tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=env):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "quick but failing")
        await alice.wait_for(message_from(bot.user_id, room))
        await alice.send(room, "!status")
        await alice.wait_for(notice_in(bot, room, "waiting:"))
    posted = [s.content for s in alice.seen if message_from(bot.user_id, room)(s)]
    assert len(posted) == 2  # the failure, then !status's answer
    assert not any("m.new_content" in c for c in posted)

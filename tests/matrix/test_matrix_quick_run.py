"""A quick run in a Matrix room posts its answer alone: one message, no status notice.

``[progress] show_after_s`` (default 3 s) keeps the "Working…" notice back until
a run has lasted that long; the fake claude answers at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.matrix.matrix_helpers import Human, joined, message_from
from tests.matrix.matrix_service import service
from tests.matrix.synapse_peer import MatrixUser, SynapseServer
from tests.matrix.test_matrix_service_e2e import ALICE, ECHO, answer_in, notice_in

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

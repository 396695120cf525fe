"""A quick run in a Slack channel posts its answer alone: one message, no status message.

``[progress] show_after_s`` (default 3 s) keeps the "Working…" message back
until a run has lasted that long; the fake claude answers at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.transports.slack import peer
from tests.transports.slack.service import ECHO, bridged

pytestmark = [pytest.mark.slack, pytest.mark.slow]


async def test_a_quick_run_posts_one_message(tmp_path: Path) -> None:
    async with bridged(tmp_path, "socket", ECHO) as b:
        ts = await b.slack.post_message(peer.ALICE, "quick one")
        # The outcome's reaction is the run's last step: anything it posted is there.
        await b.wait_for_reaction(ts, "white_check_mark")
        posted = await b.results()
    assert len(posted) == 1
    assert "quick one" in str(posted[0]["text"])
    assert posted[0]["thread_ts"] == ts


async def test_a_failed_quick_run_posts_one_message(tmp_path: Path) -> None:
    async with bridged(tmp_path, "socket", {**ECHO, "FAKE_CLAUDE_EXIT": "3"}) as b:
        ts = await b.slack.post_message(peer.ALICE, "quick but failing")
        await b.wait_for_reaction(ts, "x")
        posted = await b.results()
    assert len(posted) == 1  # the failure notice, no status message


async def test_a_long_quick_answer_is_one_message_and_never_edited(tmp_path: Path) -> None:
    text = ("word " * 50 + "\n\n") * 300 + "END-MARKER"
    async with bridged(tmp_path, "socket", ECHO) as b:
        ts = await b.slack.post_message(peer.ALICE, text)
        await b.wait_for_reaction(ts, "white_check_mark")
        posted = await b.results()
    assert len(posted) == 1  # too long for messages: attached as a file, one message
    assert not posted[0].get("edited")

"""The catch-up's bounds, against local-slack: a channel new to the bridge hands over
none of its history, and messages older than ``catch_up_max_age_s`` are not run but
told in the room, once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bridge.core.model import ExternalMessageId, RoomId, RoomKey, TransportName
from bridge.store.memory import MemoryStore
from tests.transports.slack import peer
from tests.transports.slack.harness import connected, require_local_slack, slack_settings

pytestmark = pytest.mark.slack

SLACK = TransportName("slack")
CHANNEL = RoomKey(SLACK, RoomId(peer.CHANNEL))
HOUR = 3600.0


async def notices(slack: peer.LocalSlack) -> list[str]:
    return [str(m["text"]) for m in await slack.bot_messages() if "were not run" in m["text"]]


async def test_a_channel_new_to_the_bridge_hands_over_none_of_its_history(
    tmp_path: Path,
) -> None:
    require_local_slack()
    store = MemoryStore()
    async with peer.run_local_slack(tmp_path, "socket") as slack:
        await slack.post_message(peer.ALICE, "from before the bridge")
        newest = await slack.post_message(peer.ALICE, "also from before")
        settings = slack_settings("socket", slack.api_url)
        async with connected(slack, settings, marks=store) as running:
            await running.transport.caught_up.wait()
            assert running.transport.caught_up_events == 0
            live = await slack.post_message(peer.ALICE, "after it started")
            await running.sink.wait_for(1)
        assert running.sink.texts == ["after it started"]
        marks = await store.seen_marks(SLACK)
        assert marks[CHANNEL] == ExternalMessageId(live)
        assert live > newest


async def test_messages_older_than_the_maximum_age_are_told_once_and_not_run(
    tmp_path: Path,
) -> None:
    require_local_slack()
    store = MemoryStore()
    async with peer.run_local_slack(tmp_path, "socket") as slack:
        seen = await slack.post_message(peer.ALICE, "seen before the bridge went down")
        await store.mark_seen({CHANNEL: ExternalMessageId(seen)}, time.time())
        for text in ("old one", "old two", "old three"):
            await slack.post_message(peer.ALICE, text)
        await slack.post_message(peer.BOT_USER, "the bridge's own, not counted")
        settings = slack_settings("socket", slack.api_url, catch_up_max_age_s=HOUR)
        # Two hours later: all of them are older than the maximum age.
        later = time.time() + 2 * HOUR
        for _ in range(2):
            async with connected(slack, settings, marks=store, wall=lambda: later) as running:
                await running.transport.caught_up.wait()
                assert running.transport.caught_up_events == 0
        assert running.sink.texts == []
        [notice] = await notices(slack)
    assert notice.startswith("3 message(s) sent here while chatbridge was away are older than 1 h")

"""Threads as conversations against local-slack, through ``chatbridge run``."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.transports.slack import peer
from tests.transports.slack.service import Bridged, bridged

pytestmark = [pytest.mark.slack, pytest.mark.slow]

ECHO = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_NO_TOOL": "1"}


async def answers_in(b: Bridged, thread: str) -> list[str]:
    """The bridge's messages in ``thread``: its answers (a quick run shows no progress)."""
    return [str(m["text"]) for m in await b.results() if m.get("thread_ts") == thread]


async def wait_for(b: Bridged, thread: str, count: int) -> list[str]:
    async def enough() -> bool:
        return len(await answers_in(b, thread)) >= count

    await b.wait_until(enough, f"{count} answer(s) in {thread}")
    return await answers_in(b, thread)


def runs(tmp_path: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(tmp_path / "chatbridge.db") as db:
        return db.execute("select room_id, session_id from runs order by seq").fetchall()


@pytest.mark.parametrize("mode", ["socket", "events"])
async def test_each_thread_is_its_own_conversation(tmp_path: Path, mode: str) -> None:
    room = {"conversation": "thread"}
    async with bridged(tmp_path, mode, ECHO, room_extra=room) as b:
        first = await b.slack.post_message(peer.ALICE, "alpha")
        second = await b.slack.post_message(peer.ALICE, "beta")
        assert await wait_for(b, first, 1) == ["alpha"]
        assert await wait_for(b, second, 1) == ["beta"]
        await b.slack.post_message(peer.ALICE, "gamma", thread_ts=first)
        assert await wait_for(b, first, 2) == ["alpha", "gamma"]
        top_level = [m for m in await b.results() if "thread_ts" not in m]
    assert top_level == []  # every answer went into its thread
    recorded = runs(tmp_path)
    channel = peer.CHANNEL
    assert [room for room, _ in recorded] == [
        f"{channel}/{first}",
        f"{channel}/{second}",
        f"{channel}/{first}",
    ]
    sessions = [session for _, session in recorded]
    assert sessions[0] == sessions[2] != sessions[1]  # the follow-up resumed its thread's


async def test_a_room_wide_conversation_answers_each_thread_where_it_asked(
    tmp_path: Path,
) -> None:
    """``conversation = "channel"``: a thread reply and a top-level message that
    arrive in one window are two batches, each answered in its own place."""
    extra = {"dispatcher": {"coalesce_ms": 1500, "max_wait_ms": 5000}}
    async with bridged(tmp_path, "socket", ECHO, extra=extra) as b:
        parent = await b.slack.post_message(peer.BOB, "a thread to answer in")
        reply = await b.slack.post_message(peer.ALICE, "in the thread", thread_ts=parent)
        top = await b.slack.post_message(peer.ALICE, "at the top")
        assert await wait_for(b, parent, 1) == ["in the thread"]
        # The top-level batch opens its own thread (reply_in_thread).
        assert await wait_for(b, top, 1) == ["at the top"]
    assert reply != top
    assert [room for room, _ in runs(tmp_path)] == [peer.CHANNEL, peer.CHANNEL]

"""Threads (``m.thread``) as conversations against the test Synapse, through ``chatbridge run``."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.transports.matrix.matrix_helpers import Human, Seen, joined, message_from
from tests.transports.matrix.matrix_service import service
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

ECHO = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_NO_TOOL": "1"}
ALICE = "@alice:localhost"


def in_thread(root: str) -> dict[str, Any]:
    """The content of a message in the thread under ``root`` (as Element sends it)."""
    return {
        "m.relates_to": {
            "rel_type": "m.thread",
            "event_id": root,
            "is_falling_back": True,
            "m.in_reply_to": {"event_id": root},
        }
    }


def answer_in_thread(bot: MatrixUser, room: str, root: str) -> Callable[[Seen], bool]:
    def match(seen: Seen) -> bool:
        relation = seen.content.get("m.relates_to") or {}
        return (
            message_from(bot.user_id, room)(seen)
            and seen.content.get("msgtype") == "m.text"
            and relation.get("rel_type") == "m.thread"
            and relation.get("event_id") == root
        )

    return match


async def test_each_thread_is_its_own_conversation(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    room = await alice.create_room([bot.user_id])
    room_extra = {"conversation": "thread"}
    async with service(
        tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=ECHO, room_extra=room_extra
    ):
        await alice.wait_for(joined(bot.user_id, room))
        first = await alice.send(room, "alpha")
        one = await alice.wait_for(answer_in_thread(bot, room, first))
        second = await alice.send(room, "beta")
        two = await alice.wait_for(answer_in_thread(bot, room, second))
        await alice.send(room, "gamma", extra=in_thread(first))
        (three,) = [
            s
            for s in await alice.wait_for_all(answer_in_thread(bot, room, first), count=2)
            if "gamma" in s.content["body"]
        ]
    assert one.content["body"] == "alpha"
    assert two.content["body"] == "beta"
    assert three.content["body"] == "gamma"
    with sqlite3.connect(tmp_path / "chatbridge.db") as db:
        runs = db.execute("select room_id, session_id from runs order by seq").fetchall()
    assert [r for r, _ in runs] == [f"{room}/{first}", f"{room}/{second}", f"{room}/{first}"]
    assert runs[0][1] == runs[2][1] != runs[1][1]

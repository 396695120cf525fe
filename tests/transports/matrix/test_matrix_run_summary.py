"""A run's summary, ``!usage`` and ``!sessions`` as a Matrix room sees them: ``chatbridge
run`` with the fake claude against the test Synapse (docs/conversations.md, "What a run
changed" and "Sessions"; docs/budgets.md, "!usage")."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.transports.matrix.matrix_helpers import Human, Seen, joined, message_from
from tests.transports.matrix.matrix_service import service
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

ALICE = "@alice:localhost"


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


def from_bot(bot: MatrixUser, room: str, msgtype: str, contains: str) -> Callable[[Seen], bool]:
    def match(seen: Seen) -> bool:
        return (
            message_from(bot.user_id, room)(seen)
            and seen.content.get("msgtype") == msgtype
            and contains in str(seen.content.get("body", ""))
        )

    return match


def typing_in(bot: MatrixUser, room: str) -> Callable[[Seen], bool]:
    def match(seen: Seen) -> bool:
        return (
            seen.ephemeral
            and seen.room_id == room
            and bot.user_id in (seen.source.get("users") or [])
        )

    return match


async def test_a_run_that_changed_files_says_so_attaches_its_diff_and_usage_adds_it_up(
    tmp_path: Path, synapse: SynapseServer, bot: MatrixUser, alice: Human
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    git(project, "-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-q",
        "--allow-empty", "-m", "start")  # fmt: skip
    gate = tmp_path / "gate"
    env = {"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_WAIT_FOR": str(gate), "FAKE_CLAUDE_COST": "0.25"}
    # No sign of life: the bot typing then means the run has begun (its files seen).
    room_extra = {"cwd": str(project), "sign_of_life": False}
    room = await alice.create_room([bot.user_id])
    async with service(
        tmp_path, synapse, bot, room, allowed=(ALICE,), claude_env=env, room_extra=room_extra
    ):
        await alice.wait_for(joined(bot.user_id, room))
        await alice.send(room, "add a module")
        await alice.wait_for(typing_in(bot, room))
        (project / "module.py").write_text("x = 1\ny = 2\n")  # what the run's tool wrote
        gate.touch()
        answer = await alice.wait_for(from_bot(bot, room, "m.text", "add a module"))
        diff = await alice.wait_for(from_bot(bot, room, "m.file", "The run's changes."))
        await alice.send(room, "!usage")
        usage = await alice.wait_for(from_bot(bot, room, "m.notice", "Today (UTC)"))
        await alice.send(room, "!sessions")
        sessions = await alice.wait_for(from_bot(bot, room, "m.notice", "Recent sessions"))
    assert "Changed 1 file (+2 -0): `module.py` (+2 -0)." in answer.content["body"]
    assert str(diff.content["filename"]).endswith(".diff")
    assert "this room $0.25" in usage.content["body"]
    assert "began with “add a module”" in sessions.content["body"]

"""A run's summary and ``!usage`` as a Slack channel sees them: ``chatbridge run`` with the
fake claude against local-slack (docs/conversations.md, "What a run changed";
docs/budgets.md, "!usage")."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.transports.slack import peer
from tests.transports.slack.service import Bridged, bridged

pytestmark = [pytest.mark.slack, pytest.mark.slow]


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


async def bot_text(b: Bridged, contains: str) -> str:
    """The first message of the bot's that holds ``contains``, once there is one."""

    async def found() -> bool:
        return any(contains in str(m.get("text", "")) for m in await b.results())

    await b.wait_until(found, repr(contains))
    return next(str(m["text"]) for m in await b.results() if contains in str(m.get("text", "")))


async def test_a_run_that_changed_files_says_so_and_usage_adds_it_up(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    git(project, "-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-q",
        "--allow-empty", "-m", "start")  # fmt: skip
    gate = tmp_path / "gate"
    env = {
        "FAKE_CLAUDE_ECHO": "1",
        "FAKE_CLAUDE_NO_TOOL": "1",
        "FAKE_CLAUDE_WAIT_FOR": str(gate),
        "FAKE_CLAUDE_COST": "0.5",
    }
    async with bridged(tmp_path, "socket", env, room_extra={"cwd": str(project)}) as b:
        task = await b.slack.post_message(peer.ALICE, "add a module")
        # The run has begun (its working tree as it was is taken before the prompt).
        await b.wait_for_reaction(task, "hourglass_flowing_sand")
        (project / "module.py").write_text("x = 1\n")  # what the run's tool wrote
        gate.touch()
        answer = await bot_text(b, "Changed 1 file")
        await b.slack.post_message(peer.ALICE, "!usage")
        usage = await bot_text(b, "Today (UTC)")
    assert "add a module" in answer
    assert "`module.py` (+1 -0)" in answer
    assert "this room $0.50" in usage

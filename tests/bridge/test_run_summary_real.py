"""A run's summary in chat with the real claude (console room, scripted model server):
what it changed in its git working directory under its answer, the whole diff as a file
after it, and the run's turns and cost in its status message (docs/conversations.md).
``!fork`` and ``!resume`` with the real CLI are here too: the session commands rely on
what ``--resume`` and ``--fork-session`` do."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from bridge.config import load_settings
from tests.bridge.harness import ConsoleSession, rows
from tests.bridge.real_claude import real_claude_config, see
from tests.fakes.model_server import ModelServer, ToolCall, Turn, claude_bin

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True
    ).stdout


def repo(tmp_path: Path) -> Path:
    project = tmp_path / "proj"
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    git(project, "config", "user.email", "t@example.org")
    git(project, "config", "user.name", "t")
    (project / "app.py").write_text("x = 1\ny = 2\n")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "start")
    return project


def session(tmp_path: Path, server: ModelServer, cwd: Path, **defaults: Any) -> ConsoleSession:
    config = real_claude_config(
        tmp_path,
        server,
        {
            "progress": {"show_after_s": 0},
            "defaults": {"permission_mode": "bypassPermissions", "cwd": str(cwd), **defaults},
        },
    )
    return ConsoleSession(load_settings(config))


async def test_a_run_that_changed_files_says_what_and_attaches_the_whole_diff(
    tmp_path: Path,
) -> None:
    project = repo(tmp_path)
    edit = ToolCall(
        "Edit", {"file_path": str(project / "app.py"), "old_string": "y = 2", "new_string": "y = 3"}
    )
    write = ToolCall("Write", {"file_path": str(project / "new.py"), "content": "z = 1\n"})
    script = [
        Turn(tools=(edit,)),
        Turn(tools=(write,)),
        Turn(text="Changed app.py and added new.py."),
    ]
    async with ModelServer(script) as server, session(tmp_path, server, project) as bridge:
        bridge.send("make the change")
        await see(bridge, "Changed 2 files (+2 -1)")
        await see(bridge, "The run's changes.")
        # The status message's last edit (cosmetic: it may come after the answer).
        out = await see(bridge, " turns · $")
    answer = out[out.index("Changed app.py and added new.py.") :]
    assert "`app.py` (+1 -1)" in answer
    assert "`new.py` (+1 -0)" in answer
    # The whole diff went out as a file after the answer (the console names the file).
    assert answer.index("Changed 2 files") < answer.index("The run's changes.")
    assert rows(tmp_path, "select count(*) from outbox where file is not null") == [(1,)]
    assert "Done after " in out


async def test_a_diff_over_the_rooms_file_limit_is_named_not_attached(tmp_path: Path) -> None:
    project = repo(tmp_path)
    write = ToolCall("Write", {"file_path": str(project / "data.csv"), "content": "1,2\n" * 3000})
    async with (
        ModelServer([Turn(tools=(write,)), Turn(text="wrote the data")]) as server,
        session(tmp_path, server, project, max_send_file_bytes=4096) as bridge,
    ):
        bridge.send("write the data")
        await see(bridge, "Changed 1 file (+3000 -0)")
        out = await see(bridge, "The run's diff is not attached")
    assert "(`max_send_file_bytes`, 4096 bytes)" in out
    assert rows(tmp_path, "select count(*) from outbox where file is not null") == [(0,)]


async def test_a_run_that_changed_nothing_or_is_outside_git_says_nothing_of_changes(
    tmp_path: Path,
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    async with (
        ModelServer([Turn(text="nothing to do")]) as server,
        session(tmp_path, server, plain) as bridge,
    ):
        bridge.send("look around")
        out = await see(bridge, "nothing to do")
    assert "Changed" not in out
    assert rows(tmp_path, "select count(*) from outbox where file is not null") == [(0,)]


async def test_summaries_can_be_turned_off_per_room(tmp_path: Path) -> None:
    project = repo(tmp_path)
    write = ToolCall("Write", {"file_path": str(project / "new.py"), "content": "z = 1\n"})
    async with (
        ModelServer([Turn(tools=(write,)), Turn(text="written")]) as server,
        session(tmp_path, server, project, summarize_changes=False) as bridge,
    ):
        bridge.send("write it")
        out = await see(bridge, "written")
    assert (project / "new.py").exists()
    assert "Changed" not in out


async def test_fork_continues_a_copy_the_real_claude_makes_and_resume_goes_back(
    tmp_path: Path,
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    script = [Turn(text="first turn"), Turn(text="forked turn"), Turn(text="resumed turn")]
    async with ModelServer(script) as server, session(tmp_path, server, plain) as bridge:
        bridge.send("remember 41")
        await see(bridge, "\nfirst turn\n")
        bridge.send("!fork")
        await see(bridge, "The next run starts from a copy of session")
        bridge.send("add one")
        await see(bridge, "\nforked turn\n")
        bridge.send("!sessions")
        listing = await see(bridge, "began with “remember 41”")
        bridge.send("!resume 2")
        await see(bridge, "The next run continues session")
        bridge.send("and again")
        await see(bridge, "\nresumed turn\n")
        # What the model was sent: the fork's turn carried the first conversation, and
        # the resumed original did not carry the fork's turn.
        bodies = [str(r.body) for r in server.agent_requests]
    original, fork, resumed = (
        r[0] for r in rows(tmp_path, "select session_id from runs order by seq")
    )
    assert fork != original
    assert resumed == original
    assert f"`{fork}` (current)" in listing
    [forked_turn] = [b for b in bodies if "add one" in b and "and again" not in b]
    [resumed_turn] = [b for b in bodies if "and again" in b]
    assert "remember 41" in forked_turn
    assert "remember 41" in resumed_turn
    assert "add one" not in resumed_turn

"""chatbridge's tool rules with the real claude (console room, scripted model server).

"Allow for this session" keeps a session rule in the database and nothing
else: claude's settings files stay untouched, its permission mode too; the
rule allows the same command in a later run resuming the session and ends
with ``!reset``. Room rules (``!approve always``, ``!deny always``,
``!rules allow|deny``) hold across sessions until ``!rules revoke``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.config import load_settings
from bridge.store.base import AuditAction
from tests.bridge.harness import ConsoleSession, rows
from tests.bridge.real_claude import real_claude_config, see
from tests.fakes.model_server import ModelServer, ToolCall, Turn, claude_bin

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]


def bash(command: str) -> Turn:
    return Turn(tools=(ToolCall("Bash", {"command": command}),))


def real_session(tmp_path: Path, server: ModelServer, home: str = "home") -> ConsoleSession:
    """The console room on the real claude; ``home``: claude's home (a replica's own),
    sessions carried between homes through the database."""
    project = tmp_path / "proj"
    project.mkdir(exist_ok=True)
    config = real_claude_config(
        tmp_path,
        server,
        {
            "runner": {"transcripts_in_db": True},
            "defaults": {"approve_tools": True, "cwd": str(project)},
        },
        home,
    )
    return ConsoleSession(load_settings(config))


def asked(out: str) -> list[int]:
    """The numbers of the requests the room was asked, in order."""
    return [int(part.split("`", 1)[0]) for part in out.split("(request `#")[1:]]


async def test_allow_for_the_session_keeps_a_session_rule_and_nothing_else(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "proj" / "notes.txt"
    script = [
        bash("rm -rf build"),
        Turn(tools=(ToolCall("Write", {"file_path": str(notes), "content": "hello\n"}),)),
        Turn(text="first done"),
        # The next run resumes the session: the same command is not asked, another is.
        bash("rm -rf build"),
        bash("touch other.txt"),
        Turn(text="second done"),
        # After !reset, a new session: asked again.
        bash("rm -rf build"),
        Turn(text="third done"),
    ]
    async with (
        ModelServer(script) as server,
        real_session(tmp_path, server) as bridge,
    ):
        bridge.send("clean up")
        await see(bridge, "(request `#1`")
        bridge.send("!approve session #1")
        # The Write later in the same run is asked: the mode stayed `default`.
        await see(bridge, "(request `#2`")
        assert not notes.exists()
        bridge.send("!approve #2")
        await see(bridge, "first done")
        bridge.send("again")
        # #3, the same command, is allowed by the rule without asking.
        await see(bridge, "(request `#4`")
        assert "touch other.txt" in bridge.out.getvalue().rsplit("(request `#4`", 1)[1]
        bridge.send("!deny #4")
        await see(bridge, "second done")
        bridge.send("!rules")
        listed = await see(bridge, "Rules of this room")
        assert "`Bash(rm -rf build)`" in listed.rsplit("Rules of this room", 1)[1]
        bridge.send("!reset")
        await see(bridge, "The next run starts a new Claude session.")
        bridge.send("once more")
        await see(bridge, "(request `#5`")
        bridge.send("!approve #5")
        out = await see(bridge, "third done")
    assert asked(out) == [1, 2, 4, 5]
    assert notes.read_text() == "hello\n"
    # Nothing of claude's own settings was written, in the project or the home.
    assert not (tmp_path / "proj" / ".claude").exists()
    settings = tmp_path / "home" / ".claude" / "settings.json"
    assert not settings.exists() or "rm -rf build" not in settings.read_text()
    kept = rows(tmp_path, "select scope, effect, rule, created_by from tool_rules")
    assert kept == [("session", "allow", "Bash(rm -rf build)", "local")]
    decided = rows(tmp_path, "select number, state, decided_by, reason from approvals")
    assert decided[2] == (3, "allowed", None, "allowed by rule 1 (Bash(rm -rf build))")
    assert [d[1] for d in decided] == ["allowed_session", "allowed", "allowed", "denied", "allowed"]
    trail = rows(tmp_path, "select action, detail from audit where action like 'rule%'")
    assert trail == [(AuditAction.RULE_ADDED.value, "rule 1 session allow Bash(rm -rf build)")]
    requests = [r.body for r in server.agent_requests]
    assert json.dumps(requests).count("acceptEdits") == 0


async def test_room_rules_hold_across_sessions_until_revoked(tmp_path: Path) -> None:
    script = [
        bash("touch made.txt"),
        bash("rm -rf build"),
        Turn(text="first done"),
        # A new session (after !reset): the room's rules decide, nobody is asked.
        bash("touch made.txt"),
        bash("rm -rf build"),
        Turn(text="second done"),
        # Rule 1 revoked: asked again.
        bash("touch made.txt"),
        Turn(text="third done"),
    ]
    async with ModelServer(script) as server, real_session(tmp_path, server) as bridge:
        bridge.send("make it")
        await see(bridge, "(request `#1`")
        bridge.send("!approve always #1")
        await see(bridge, "(request `#2`")
        bridge.send("!deny always #2 not from chat")
        await see(bridge, "first done")
        bridge.send("!reset")
        await see(bridge, "The next run starts a new Claude session.")
        bridge.send("again")
        await see(bridge, "second done")
        bridge.send("!rules revoke 1")
        await see(bridge, "is revoked")
        bridge.send("once more")
        await see(bridge, "(request `#5`")
        bridge.send("!approve #5")
        out = await see(bridge, "third done")
    assert asked(out) == [1, 2, 5]
    decided = rows(tmp_path, "select number, state, decided_by, reason from approvals")
    assert decided[2:4] == [
        (3, "allowed", None, "allowed by rule 1 (Bash(touch made.txt))"),
        (4, "denied", None, "a rule of this room denies it (Bash(rm -rf build))"),
    ]
    # claude was told why, in the tool result the model saw.
    seen = [text for r in server.agent_requests for text in r.texts()]
    assert any("a rule of this room denies it" in text for text in seen)
    kept = rows(tmp_path, "select id, scope, effect, rule, revoked_by is not null from tool_rules")
    assert kept == [
        (1, "room", "allow", "Bash(touch made.txt)", 1),
        (2, "room", "deny", "Bash(rm -rf build)", 0),
    ]
    assert not (tmp_path / "proj" / ".claude").exists()


async def test_a_session_rule_holds_on_the_replica_that_resumes_the_session(
    tmp_path: Path,
) -> None:
    script = [
        bash("rm -rf build"),
        Turn(text="first done"),
        bash("rm -rf build"),
        bash("touch other.txt"),
        Turn(text="second done"),
    ]
    async with ModelServer(script) as server:
        async with real_session(tmp_path, server, "home-a") as first:
            first.send("clean up")
            await see(first, "(request `#1`")
            first.send("!approve session #1")
            await see(first, "first done")
            await first.finish()
        # Another replica (its own claude home, the same database) resumes the session.
        async with real_session(tmp_path, server, "home-b") as second:
            second.send("again")
            await see(second, "(request `#3`")
            out = second.out.getvalue()
            assert "touch other.txt" in out.rsplit("(request `#3`", 1)[1]
            assert "(request `#2`" not in out
            second.send("!approve #3")
            await see(second, "second done")
    decided = rows(tmp_path, "select number, state, reason from approvals")
    assert decided[1] == (2, "allowed", "allowed by rule 1 (Bash(rm -rf build))")

"""``!sessions``, ``!resume``, ``!fork`` and ``!usage`` through the whole service (console room,
the fake claude keeping sessions as files like the real CLI; docs/conversations.md). The
CLI's own ``--fork-session`` is checked against the real claude in
tests/runner/test_real_claude_sessions.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from bridge.config import load_settings
from tests.bridge.harness import ConsoleSession, rows, write_config

WAIT_S = 30.0


def session(tmp_path: Path, **env: str) -> ConsoleSession:
    sessions = tmp_path / "sessions"
    sessions.mkdir(exist_ok=True)
    base = {
        "FAKE_CLAUDE_ECHO": "1",
        "FAKE_CLAUDE_SESSIONS_DIR": str(sessions),
        "FAKE_CLAUDE_RECORD": str(tmp_path / "record.json"),
    }
    path = write_config(tmp_path, {"dispatcher": {"coalesce_ms": 50}}, env={**base, **env})
    return ConsoleSession(load_settings(path))


def argv_of_last_run(tmp_path: Path) -> list[str]:
    return list(json.loads((tmp_path / "record.json").read_text())["argv"])


async def answered(bridge: ConsoleSession, text: str) -> None:
    await bridge.wait_for(f"\n{text}\n")


async def test_sessions_lists_each_session_with_its_first_prompt_and_cost(tmp_path: Path) -> None:
    async with asyncio.timeout(WAIT_S), session(tmp_path, FAKE_CLAUDE_COST="0.5") as bridge:
        bridge.send("plan the migration")
        await answered(bridge, "plan the migration")
        bridge.send("and the rollback")
        await answered(bridge, "and the rollback")
        bridge.send("!reset")
        await bridge.wait_for("The next run starts a new Claude session.")
        bridge.send("fix the flaky test")
        await answered(bridge, "fix the flaky test")
        bridge.send("!sessions")
        out = await bridge.wait_for("Recent sessions")
        await bridge.wait_for("began with “plan the migration”")
        out = bridge.out.getvalue()
    [(newest,), (oldest,)] = rows(
        tmp_path, "select session_id from runs group by session_id order by max(seq) desc"
    )
    listing = out[out.index("Recent sessions") :]
    assert f"1. `{newest}` (current): 1 run" in listing
    assert "began with “fix the flaky test”" in listing
    assert f"2. `{oldest}`: 2 runs" in listing
    assert "$1.00" in listing  # two runs of $0.50 each


async def test_resume_makes_the_next_run_continue_an_earlier_session(tmp_path: Path) -> None:
    async with asyncio.timeout(WAIT_S), session(tmp_path) as bridge:
        bridge.send("first topic")
        await answered(bridge, "first topic")
        bridge.send("!reset")
        await bridge.wait_for("The next run starts a new Claude session.")
        bridge.send("second topic")
        await answered(bridge, "second topic")
        bridge.send("!resume 2")
        await bridge.wait_for("The next run continues session")
        bridge.send("back to the first")
        await answered(bridge, "back to the first")
    first, second, third = (
        r[0] for r in rows(tmp_path, "select session_id from runs order by seq")
    )
    assert first != second
    assert third == first
    assert f"--resume={first}" in argv_of_last_run(tmp_path)


async def test_resume_never_takes_a_session_of_another_conversation(tmp_path: Path) -> None:
    async with asyncio.timeout(WAIT_S), session(tmp_path) as bridge:
        bridge.send("mine")
        await answered(bridge, "mine")
        bridge.send("!resume 0f6c1d9e-0000-4000-8000-000000000000")
        await bridge.wait_for("Name a session by its number")
        bridge.send("!resume 7")
        await bridge.wait_for("Name a session by its number", count=2)
    audited = rows(tmp_path, "select count(*) from audit where action = 'session_resumed'")
    assert audited == [(0,)]


async def test_fork_runs_on_a_copy_and_leaves_the_session_as_it_was(tmp_path: Path) -> None:
    async with asyncio.timeout(WAIT_S), session(tmp_path) as bridge:
        bridge.send("base work")
        await answered(bridge, "base work")
        bridge.send("!fork")
        await bridge.wait_for("The next run starts from a copy of session")
        bridge.send("an experiment")
        await answered(bridge, "an experiment")
        forked_argv = argv_of_last_run(tmp_path)
        bridge.send("more of it")
        await answered(bridge, "more of it")
        after_argv = argv_of_last_run(tmp_path)
    original, fork, continued = (
        r[0] for r in rows(tmp_path, "select session_id from runs order by seq")
    )
    assert "--fork-session" in forked_argv
    assert f"--resume={original}" in forked_argv
    assert fork != original
    # The fork is used up: the next run goes on in the fork, without forking again.
    assert continued == fork
    assert "--fork-session" not in after_argv
    # The original session's history is as it was before the fork.
    [kept] = list((tmp_path / "sessions").rglob(f"{original}.jsonl"))
    assert [json.loads(line)["prompt"] for line in kept.read_text().splitlines()] == ["base work"]


async def test_fork_with_no_session_says_so_and_changes_nothing(tmp_path: Path) -> None:
    async with asyncio.timeout(WAIT_S), session(tmp_path) as bridge:
        bridge.send("!fork")
        await bridge.wait_for("There is no session to fork")
        bridge.send("hello")
        await answered(bridge, "hello")
    assert "--fork-session" not in argv_of_last_run(tmp_path)


async def test_usage_shows_todays_spend_against_the_budgets_and_the_costliest_runs(
    tmp_path: Path,
) -> None:
    path = write_config(
        tmp_path,
        {
            "dispatcher": {"coalesce_ms": 50},
            "defaults": {"daily_budget_usd": 10.0},
            "budget": {"daily_usd": 50.0},
        },
        env={"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_COST": "1.25"},
    )
    async with asyncio.timeout(WAIT_S), ConsoleSession(load_settings(path)) as bridge:
        bridge.send("one")
        await answered(bridge, "one")
        bridge.send("two")
        await answered(bridge, "two")
        bridge.send("!usage")
        await bridge.wait_for("Costliest runs today:")
        out = bridge.out.getvalue()
    usage = out[out.index("Today (UTC)") :]
    assert "this room $2.50 of $10.00" in usage
    assert "the whole service $2.50 of $50.00" in usage
    run_ids = [r[0] for r in rows(tmp_path, "select id from runs")]
    assert all(f"`{run_id}`: $1.25" in usage for run_id in run_ids)


async def fork_asked(bridge: ConsoleSession) -> None:
    """One run, then ``!fork`` of its session, not yet used."""
    bridge.send("base work")
    await answered(bridge, "base work")
    bridge.send("!fork")
    await bridge.wait_for("The next run starts from a copy of session")


async def test_a_fork_given_up_by_reset_does_not_fork_a_later_session(tmp_path: Path) -> None:
    # !fork, then !reset: the next run starts fresh; the fork asked for the old session
    # must not wait to fork the new one a run later.
    async with asyncio.timeout(WAIT_S), session(tmp_path) as bridge:
        await fork_asked(bridge)
        bridge.send("!reset")
        await bridge.wait_for("The next run starts a new Claude session.")
        bridge.send("fresh start")
        await answered(bridge, "fresh start")
        bridge.send("go on")
        await answered(bridge, "go on")
    assert "--fork-session" not in argv_of_last_run(tmp_path)
    _, fresh, continued = (r[0] for r in rows(tmp_path, "select session_id from runs order by seq"))
    assert continued == fresh


async def test_resume_after_fork_continues_the_session_it_names(tmp_path: Path) -> None:
    # "!resume N" says the next run continues session N: a !fork asked before is given up.
    async with asyncio.timeout(WAIT_S), session(tmp_path) as bridge:
        await fork_asked(bridge)
        bridge.send("!resume 1")
        await bridge.wait_for("The next run continues session")
        bridge.send("go on")
        await answered(bridge, "go on")
    assert "--fork-session" not in argv_of_last_run(tmp_path)
    first, second = (r[0] for r in rows(tmp_path, "select session_id from runs order by seq"))
    assert second == first

"""claude's questions and plans answered in the room, end to end: the real ``chatbridge``
process on the console, the real ``claude`` against the scripted model server
(docs/live-runs.md, "Questions and plans"); also across a restart and a kill -9."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.bridge.bridge_process import Bridge, wait_rows
from tests.bridge.harness import rows
from tests.bridge.questions import MULTI, SINGLE, asking, planning, told
from tests.bridge.real_claude import real_claude_config
from tests.fakes.model_server import ModelServer, Turn, claude_bin

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]

WAIT_S = 90.0


def config(tmp_path: Path, server: ModelServer, **defaults: Any) -> Path:
    return real_claude_config(tmp_path, server, {"defaults": {"approve_tools": True, **defaults}})


async def answered(tmp_path: Path, script: list[Turn], reply: str) -> tuple[str, list[str]]:
    async with asyncio.timeout(WAIT_S), ModelServer(script) as server:
        bridge = Bridge(config(tmp_path, server))
        await bridge.start()
        bridge.send("ask me")
        await bridge.wait_for("Claude asks (question `#1`)")
        bridge.send(reply)
        await bridge.wait_for("Thanks, noted.")
        assert await bridge.end_input() == 0
        return bridge.out, told(server)


async def test_a_single_choice_question_is_answered_with_its_option_number(
    tmp_path: Path,
) -> None:
    out, texts = await answered(tmp_path, asking(SINGLE), "!answer #1 2")
    assert "`Which database?`" in out
    assert "2. `PostgreSQL`: `a server`" in out
    assert "Question `#1`: answered by" in out
    assert "`Which database?` → `PostgreSQL`." in out
    assert any(t.startswith('Your questions have been answered: "Which database?"="PostgreSQL"')
               for t in texts)  # fmt: skip
    assert not any("did not answer" in t for t in texts)


async def test_multi_select_and_free_text_answers_reach_claude(tmp_path: Path) -> None:
    out, texts = await answered(
        tmp_path, asking(MULTI, SINGLE), "!answer #1 1,3; DuckDB, in memory"
    )
    assert "`Which checks?` (one or more)" in out
    # An answer none of the options names is worded differently by claude 2.1.
    expected = (
        'The user answered: "Which checks?"="ruff, pytest", "Which database?"="DuckDB, in memory".'
    )
    assert any(t.startswith(expected) for t in texts)


async def test_an_answer_that_fits_no_option_is_refused_and_the_question_waits(
    tmp_path: Path,
) -> None:
    script = asking(SINGLE)
    async with asyncio.timeout(WAIT_S), ModelServer(script) as server:
        bridge = Bridge(config(tmp_path, server))
        await bridge.start()
        bridge.send("ask me")
        await bridge.wait_for("Claude asks (question `#1`)")
        bridge.send("!answer #1")  # once answered with the free text "#1"
        await bridge.wait_for("1 question(s), 0 answer(s)")
        bridge.send("!answer #1 1,2")
        await bridge.wait_for("Question 1 takes one option, not `1,2`.")
        bridge.send("!answer #1 7")
        await bridge.wait_for("Question 1 has options 1 to 2: `7` is not one.")
        bridge.send("!approve #1")
        await bridge.wait_for("Question `#1` wants an answer")
        bridge.send("!answer #1 1")
        await bridge.wait_for("Thanks, noted.")
        assert await bridge.end_input() == 0
    assert not any("#1" in t for t in told(server))
    assert any('"Which database?"="SQLite"' in t for t in told(server))


async def planned(tmp_path: Path, reply: str, *then: str) -> tuple[str, list[str]]:
    """A run in plan mode whose plan is answered ``reply``; ``then``: the answers to the
    request that follows it (the Write), if one is expected."""
    notes = tmp_path / "notes.md"
    async with asyncio.timeout(WAIT_S), ModelServer(planning(notes)) as server:
        bridge = Bridge(config(tmp_path, server, permission_mode="plan"))
        await bridge.start()
        bridge.send("plan it")
        await bridge.wait_for("Claude proposes this plan (plan `#1`)")
        bridge.send(reply)
        for answer in then:
            await bridge.wait_for("(request `#2`")
            bridge.send(answer)
        await bridge.wait_for("Plan carried out.")
        assert await bridge.end_input() == 0
        return bridge.out, told(server)


async def test_a_plan_is_shown_in_full_and_approved_with_edits_asked(tmp_path: Path) -> None:
    out, texts = await planned(tmp_path, "!approve #1", "!approve #2")  # the Write is asked
    assert "40. `rm -rf /srv/data`" in out  # the whole plan, its last step too
    assert "Plan `#1`: approved by" in out
    assert "each edit asked one by one" in out
    assert any(t.startswith("User has approved your plan.") for t in texts)


async def test_a_plan_approved_with_edits_accepted_runs_its_edits_unasked(tmp_path: Path) -> None:
    out, _ = await planned(tmp_path, "!approve edits #1")
    assert "claude starts with edits accepted" in out
    assert "(request `#2`" not in out
    assert (tmp_path / "notes.md").read_text() == "notes\n"


async def test_a_plan_sent_back_gives_claude_the_feedback(tmp_path: Path) -> None:
    out, texts = await planned(tmp_path, "!deny #1 back up /srv/data first", "!deny #2")
    assert "Plan `#1`: sent back to planning by" in out
    assert "The user wants you to keep planning: back up /srv/data first" in texts
    assert not any(t.startswith("User has approved your plan.") for t in texts)


async def answered_after_a_restart(
    path: Path, how: signal.Signals, *, prompt: str, asked: str, reply: str, last: str
) -> str:
    """``prompt`` sent, the bridge ended by ``how`` once ``asked`` was posted, started
    again, ``reply`` sent; the second bridge's output once ``last`` came."""
    bridge = Bridge(path)
    await bridge.start()
    bridge.send(prompt)
    await bridge.wait_for(asked)
    await wait_rows(path.parent, "select message_id is not null from approvals", [(1,)])
    bridge.signal(how)
    await bridge.exit_code()
    again = Bridge(path)
    await again.start()
    again.send(reply)
    await again.wait_for(last)
    assert await again.end_input() == 0
    return again.out


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
async def test_a_question_waiting_at_a_restart_is_answered_after_it_once(
    tmp_path: Path, how: signal.Signals
) -> None:
    async with asyncio.timeout(WAIT_S), ModelServer(asking(SINGLE)) as server:
        out = await answered_after_a_restart(
            config(tmp_path, server), how, prompt="ask me",
            asked="Claude asks (question `#1`)", reply="!answer #1 2", last="Thanks, noted.",
        )  # fmt: skip
    assert "Claude asks" not in out  # not posted twice
    assert rows(tmp_path, "select number, state from approvals") == [(1, "allowed")]
    assert any('"Which database?"="PostgreSQL"' in t for t in told(server))


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
async def test_a_plan_waiting_at_a_restart_is_approved_after_it(
    tmp_path: Path, how: signal.Signals
) -> None:
    notes = tmp_path / "notes.md"
    async with asyncio.timeout(WAIT_S), ModelServer(planning(notes)) as server:
        out = await answered_after_a_restart(
            config(tmp_path, server, permission_mode="plan"), how, prompt="plan it",
            asked="Claude proposes this plan (plan `#1`)", reply="!approve edits #1",
            last="Plan carried out.",
        )  # fmt: skip
    assert "Claude proposes" not in out
    assert rows(tmp_path, "select number, state from approvals") == [(1, "allowed_session")]
    assert notes.read_text() == "notes\n"


async def test_plan_command_starts_the_next_run_in_plan_mode(tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    async with asyncio.timeout(WAIT_S), ModelServer(planning(notes)) as server:
        bridge = Bridge(config(tmp_path, server))  # configured mode: default
        await bridge.start()
        bridge.send("!plan")
        await bridge.wait_for("permission mode `plan` from now on")
        bridge.send("plan it")
        await bridge.wait_for("Claude proposes this plan (plan `#1`)")
        bridge.send("!approve edits #1")
        await bridge.wait_for("Plan carried out.")
        assert await bridge.end_input() == 0
    assert notes.read_text() == "notes\n"

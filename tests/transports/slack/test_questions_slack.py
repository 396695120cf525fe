"""claude's questions and plans answered from Slack, end to end: ``chatbridge run`` with the
real ``claude`` against the scripted model server, and local-slack (docs/live-runs.md,
"Questions and plans")."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.bridge.questions import MULTI, PLAN, SINGLE, asking, planning, told
from tests.fakes.model_server import ModelServer, claude_bin, claude_env
from tests.transports.slack import peer
from tests.transports.slack.approvals import buttons, message, wait_closed, wait_for_ephemeral
from tests.transports.slack.service import Bridged, bridged

pytestmark = [
    pytest.mark.slack,
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]


def real(tmp_path: Path, server: ModelServer, **defaults: Any) -> dict[str, Any]:
    return {
        "runner": {"claude_bin": str(claude_bin())},
        "defaults": {
            "approve_tools": True,
            "env": claude_env(server.url, tmp_path / "home"),
            **defaults,
        },
    }


async def posted(b: Bridged, start: str) -> dict[str, Any]:
    async def found() -> bool:
        return any(str(m.get("text")).startswith(start) for m in await b.results())

    await b.wait_until(found, repr(start), timeout=60)
    return next(m for m in await b.results() if str(m.get("text")).startswith(start))


async def said(b: Bridged, text: str) -> None:
    async def found() -> bool:
        return any(text in str(m.get("text")) for m in await b.results())

    await b.wait_until(found, repr(text), timeout=60)


async def test_a_question_is_answered_in_slack_by_the_runs_sender(tmp_path: Path) -> None:
    async with ModelServer(asking(MULTI, SINGLE)) as server:
        async with bridged(
            tmp_path,
            "socket",
            allowed=(peer.ALICE, peer.BOB),
            room_extra={"approvers": [peer.BOB]},
            extra=real(tmp_path, server),
        ) as b:
            await b.slack.post_message(peer.ALICE, "ask me")
            question = await posted(b, "Claude asks (question")
            shown = str(question["text"])
            assert "Which checks?" in shown
            assert "pytest" in shown
            # Alice is no approver, but the run works on her message: she answers.
            await b.slack.post_message(peer.ALICE, "!answer #1 1,3; 2")
            await said(b, "Thanks, noted.")
            closed = await message(b, str(question["ts"]))
            assert "answered by" in str(closed["text"])
            assert "U0ALICE" in str(closed["text"])
            assert not buttons(closed)
        assert any(
            '"Which checks?"="ruff, pytest", "Which database?"="PostgreSQL"' in t
            for t in told(server)
        )


@contextlib.asynccontextmanager
async def planned(tmp_path: Path, notes: Path) -> AsyncIterator[tuple[Bridged, dict[str, Any]]]:
    """A run in plan mode of Alice's, Bob the approver, its plan posted."""
    async with (
        ModelServer(planning(notes)) as server,
        bridged(
            tmp_path,
            "socket",
            allowed=(peer.ALICE, peer.BOB),
            room_extra={"approvers": [peer.BOB]},
            extra=real(tmp_path, server, permission_mode="plan"),
        ) as b,
    ):
        await b.slack.post_message(peer.ALICE, "plan it")
        yield b, await posted(b, "Claude proposes this plan")


async def test_a_plan_is_shown_in_slack_and_started_with_edits_accepted_by_a_button(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes.md"
    async with planned(tmp_path, notes) as (b, plan):
        # The whole plan is in the room: in the request, or in the snippet beside it.
        assert PLAN.splitlines()[-1].replace("`", "") in str(plan["text"]).replace("`", "")
        await b.slack.click(peer.BOB, str(plan["ts"]), buttons(plan)["allow_session"])
        await said(b, "Plan carried out.")
        closed = await wait_closed(b, str(plan["ts"]), "approved by")
        assert "edits accepted" in str(closed["text"])
        assert notes.read_text() == "notes\n"


async def test_a_single_choice_question_is_answered_by_its_option_button(tmp_path: Path) -> None:
    async with ModelServer(asking(SINGLE)) as server:
        async with bridged(
            tmp_path, "socket", allowed=(peer.ALICE,), extra=real(tmp_path, server)
        ) as b:
            await b.slack.post_message(peer.ALICE, "ask me")
            question = await posted(b, "Claude asks (question")
            shown = buttons(question)
            # The question's options, not a tool request's Allow / Deny.
            assert set(shown) == {"option_1", "option_2"}
            await b.slack.click(peer.ALICE, str(question["ts"]), shown["option_2"])
            await said(b, "Thanks, noted.")
            closed = await wait_closed(b, str(question["ts"]), "answered by")
            assert "PostgreSQL" in str(closed["text"])
        assert any('"Which database?"="PostgreSQL"' in t for t in told(server))


async def test_a_question_button_of_someone_not_asked_is_refused_privately(
    tmp_path: Path,
) -> None:
    async with (
        ModelServer(asking(SINGLE)) as server,
        bridged(
            tmp_path,
            "socket",
            allowed=(peer.ALICE, peer.BOB),
            room_extra={"approvers": [peer.ALICE]},
            extra=real(tmp_path, server),
        ) as b,
    ):
        await b.slack.post_message(peer.ALICE, "ask me")
        question = await posted(b, "Claude asks (question")
        # Bob sent nothing of the run and approves nothing: told so, only him.
        await b.slack.click(peer.BOB, str(question["ts"]), buttons(question)["option_1"])
        await wait_for_ephemeral(b, peer.BOB, "not an approver")
        assert buttons(await message(b, str(question["ts"])))
        await b.slack.click(peer.ALICE, str(question["ts"]), buttons(question)["option_1"])
        await said(b, "Thanks, noted.")


async def test_keep_planning_says_how_to_send_feedback_and_start_edits_asked_starts(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes.md"
    async with planned(tmp_path, notes) as (b, plan):
        shown = buttons(plan)
        assert set(shown) == {"allow", "allow_session", "keep_planning"}
        await b.slack.click(peer.BOB, str(plan["ts"]), shown["keep_planning"])
        await wait_for_ephemeral(b, peer.BOB, "!deny #1 ")
        assert buttons(await message(b, str(plan["ts"])))  # still waiting
        await b.slack.click(peer.BOB, str(plan["ts"]), shown["allow"])
        closed = await wait_closed(b, str(plan["ts"]), "approved by")
        assert "each edit asked" in str(closed["text"])
        # Edits asked: the Write is a tool request of its own.
        write = await posted(b, "Claude asks to use")
        await b.slack.click(peer.BOB, str(write["ts"]), buttons(write)["allow"])
        await said(b, "Plan carried out.")
        assert notes.read_text() == "notes\n"

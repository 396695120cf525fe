"""What the real claude does with AskUserQuestion and ExitPlanMode answers (docs/live-runs.md).

Experiments pinned as tests: the shape of the allow that carries a person's
answers to claude, and what the plan request holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from bridge.live.questions import ACCEPT_EDITS
from runner import Allow, Deny, PermissionAsked, RunControl, RunEvent, ToolUse, run_claude
from tests.bridge.questions import MULTI, SINGLE
from tests.fakes.model_server import ModelServer, ToolCall, Turn, claude_bin
from tests.runner.conftest import Recorder
from tests.runner.live_helpers import asking
from tests.runner.real_claude import real_request

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]

QUESTIONS = [SINGLE, MULTI]


async def test_answers_in_updated_input_reach_the_model(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    script = [
        Turn(tools=(ToolCall("AskUserQuestion", {"questions": QUESTIONS}),)),
        Turn(text="Thanks."),
    ]
    control = RunControl()
    answers = {"Which database?": "PostgreSQL", "Which checks?": "ruff, pytest"}

    async def on_event(event: RunEvent) -> None:
        await recorder(event)
        if isinstance(event, PermissionAsked):
            control.answer(event.request_id, Allow({**event.input, "answers": answers}))

    async with ModelServer(script) as server:
        report = await run_claude(
            asking(run_id, tmp_path, server, "ask me"), on_event, control=control
        )
        told = server.agent_requests[-1].texts()[-1]
    assert report.status is RunStatus.SUCCEEDED, report.error
    (asked,) = recorder.of(PermissionAsked)
    assert asked.tool_name == "AskUserQuestion"
    assert asked.input == {"questions": QUESTIONS}
    assert told.startswith(
        'Your questions have been answered: "Which database?"="PostgreSQL",'
        ' "Which checks?"="ruff, pytest".'
    )


PLAN = "## Plan\n1. write notes\n2. finally run `rm -rf /srv/data`"


async def _plan_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder, decision: Allow | Deny
) -> tuple[PermissionAsked, ToolUse, list[str], list[PermissionAsked]]:
    """claude in plan mode proposes PLAN, is answered ``decision``, then writes a file."""
    notes = tmp_path / "work" / "notes.md"
    script = [
        Turn(tools=(ToolCall("ExitPlanMode", {"plan": PLAN}),)),
        Turn(tools=(ToolCall("Write", {"file_path": str(notes), "content": "notes\n"}),)),
        Turn(text="Done."),
    ]
    control = RunControl()

    async def on_event(event: RunEvent) -> None:
        await recorder(event)
        if isinstance(event, PermissionAsked):
            if event.tool_name == "ExitPlanMode":
                control.answer(event.request_id, decision)
            else:
                control.answer(event.request_id, Allow(event.input))

    async with ModelServer(script) as server:
        request = real_request(
            run_id, tmp_path, server, "plan it",
            permission_mode="plan", allowed_tools=(), approve_tools=True,
        )  # fmt: skip
        report = await run_claude(request, on_event, control=control)
        texts = [t for r in server.agent_requests for t in r.texts()]
    assert report.status is RunStatus.SUCCEEDED, report.error
    asked = recorder.of(PermissionAsked)
    (use,) = [u for u in recorder.of(ToolUse) if u.name == "ExitPlanMode"]
    return asked[0], use, texts, asked[1:]


async def test_a_plan_is_asked_with_an_empty_input_and_the_plan_in_the_tool_use(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    asked, use, texts, later = await _plan_run(run_id, tmp_path, recorder, Allow({"plan": PLAN}))
    assert (asked.tool_name, asked.input) == ("ExitPlanMode", {})
    assert use.id == asked.tool_use_id
    assert use.input == {"plan": PLAN}
    assert any(t.startswith("User has approved your plan.") and PLAN in t for t in texts)
    # Approved plainly: claude leaves plan mode for the default mode, edits are asked.
    assert [a.tool_name for a in later] == ["Write"]


async def test_a_plan_approved_with_accept_edits_starts_without_asking_edits(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    _, _, texts, later = await _plan_run(
        run_id, tmp_path, recorder, Allow({"plan": PLAN}, (ACCEPT_EDITS,))
    )
    assert any(t.startswith("User has approved your plan.") for t in texts)
    assert later == []
    assert (tmp_path / "work" / "notes.md").read_text() == "notes\n"


async def test_a_plan_denied_with_feedback_keeps_claude_planning(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    feedback = "The user wants you to keep planning: add a backup step first"
    _, _, texts, later = await _plan_run(run_id, tmp_path, recorder, Deny(feedback))
    assert feedback in texts
    assert not any(t.startswith("User has approved your plan.") for t in texts)
    # Still in plan mode, where claude 2.1 leaves an edit to its host: asked, as in
    # default mode (the room sees it as a tool request).
    assert [a.tool_name for a in later] == ["Write"]


async def test_edits_accepted_with_a_plan_end_with_its_run_not_its_session(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # `!approve edits` holds for the run's claude: the next run, resuming the session
    # with no permission mode of the room's, has its edits asked again.
    control = RunControl()
    notes = tmp_path / "work" / "notes.md"

    async def on_event(event: RunEvent) -> None:
        await recorder(event)
        if isinstance(event, PermissionAsked):
            decision = Allow({"plan": PLAN}, (ACCEPT_EDITS,))
            control.answer(event.request_id, decision if event.tool_name == "ExitPlanMode"
                           else Deny("not now"))  # fmt: skip

    first = [Turn(tools=(ToolCall("ExitPlanMode", {"plan": PLAN}),)), Turn(text="Planned.")]
    second = [
        Turn(tools=(ToolCall("Write", {"file_path": str(notes), "content": "again\n"}),)),
        Turn(text="Done."),
    ]
    async with ModelServer(first + second) as server:
        fields: dict[str, object] = {"allowed_tools": (), "approve_tools": True}
        request = real_request(run_id, tmp_path, server, "plan", permission_mode="plan", **fields)
        report = await run_claude(request, on_event, control=control)
        assert report.status is RunStatus.SUCCEEDED, report.error
        control = RunControl()
        again = real_request(
            RunId(f"{run_id}-2"), tmp_path, server, "write it",
            permission_mode="", session_id=report.session_id, **fields,
        )  # fmt: skip
        report = await run_claude(again, on_event, control=control)
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert [a.tool_name for a in recorder.of(PermissionAsked)] == ["ExitPlanMode", "Write"]
    assert not notes.exists()

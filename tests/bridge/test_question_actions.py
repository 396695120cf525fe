"""A button or reaction that answers a question (Slack option buttons, Matrix replies and
number reactions) is read as ``!answer`` reads a reply, and only ever answers a question
(docs/live-runs.md, "Questions and plans")."""

from __future__ import annotations

from pathlib import Path

from bridge.core.transport import Accepted, ApprovalAction, ApprovalChoice
from runner.events import PermissionAsked
from tests.bridge.approval_posts import POSTED, Bound
from tests.bridge.questions import PLAN, SINGLE

QUESTION = PermissionAsked("r1", "AskUserQuestion", {"questions": [SINGLE]}, "tu1", "", ())


def action(bound: Bound, answer: str = "", *, guide: bool = False) -> ApprovalAction:
    choice = ApprovalChoice.DENY if guide else ApprovalChoice.ALLOW
    return ApprovalAction(bound.key, bound.user, POSTED, choice, answer, guide)


async def test_an_options_answer_gives_claude_that_options_label(tmp_path: Path) -> None:
    bound = Bound(tmp_path)
    await bound.asks(QUESTION)
    assert await bound.flow.on_action(action(bound, "2")) is Accepted.ACCEPTED
    [answer] = bound.answers()
    assert isinstance(answer, dict)
    assert answer["behavior"] == "allow"
    assert answer["updatedInput"]["answers"] == {"Which database?": "PostgreSQL"}


async def test_an_answer_that_is_no_option_is_refused_to_the_person_and_the_question_waits(
    tmp_path: Path,
) -> None:
    bound = Bound(tmp_path)
    await bound.asks(QUESTION)
    await bound.flow.on_action(action(bound, "1,2"))
    [(_, text)] = bound.told.told
    assert "takes one option" in text
    assert bound.answers() == []
    assert len(await bound.store.pending_approvals()) == 1


async def test_a_number_on_a_tool_request_is_refused_never_an_approval(tmp_path: Path) -> None:
    bound = Bound(tmp_path)
    await bound.asks(bound.asked)  # Bash `ls`
    await bound.flow.on_action(action(bound, "1"))
    [(_, text)] = bound.told.told
    assert "is not a question" in text
    assert bound.answers() == []
    assert len(await bound.store.pending_approvals()) == 1


async def test_keep_planning_tells_the_person_how_and_decides_nothing(tmp_path: Path) -> None:
    bound = Bound(tmp_path)
    await bound.asks(PermissionAsked("r1", "ExitPlanMode", {"plan": PLAN}, "tu1", "", ()))
    await bound.flow.on_action(action(bound, guide=True))
    [(_, text)] = bound.told.told
    assert "deny #1 what to change" in text
    assert bound.answers() == []
    assert len(await bound.store.pending_approvals()) == 1


async def test_a_command_sent_as_a_reply_to_a_question_is_not_its_answer(tmp_path: Path) -> None:
    bound = Bound(tmp_path)
    await bound.asks(QUESTION)
    await bound.flow.on_action(action(bound, "!deny #1"))
    [(_, text)] = bound.told.told
    assert "messages of their own" in text
    assert bound.answers() == []

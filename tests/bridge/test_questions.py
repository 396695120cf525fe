"""How a person's reply to claude's questions is read, and what a question or plan sends
claude (bridge/live/questions.py; docs/live-runs.md, "Questions and plans")."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.core.model import RoomId, RoomKey, RunId, TransportName
from bridge.core.text import visible
from bridge.core.transport import ApprovalChoice
from bridge.live.approvals import Verdict, judge_answer
from bridge.live.questions import (
    ACCEPT_EDITS,
    ANSWERS_LIMIT_BYTES,
    AnswerError,
    Question,
    answer_decision,
    question_text,
    questions,
    read_answers,
    recorded_answers,
    unanswerable,
)
from bridge.store.base import Approval, ApprovalState
from runner.control import Allow
from tests.bridge.approval_rooms import ALICE, BOB, EVE, room

SINGLE = Question("Which database?", "DB", ("SQLite", "PostgreSQL"), ("", ""), multi=False)
MULTI = Question("Which checks?", "", ("ruff", "mypy", "pytest"), ("", "", ""), multi=True)


def kept(asked: list[Question], reply: str) -> list[str]:
    return list(json.loads(read_answers(asked, reply)))


def test_option_numbers_become_their_labels() -> None:
    assert kept([SINGLE], "2") == ["PostgreSQL"]
    assert kept([MULTI], "3, 1") == ["pytest, ruff"]
    assert kept([MULTI, SINGLE], "1,3; 1") == ["ruff, pytest", "SQLite"]
    assert kept([MULTI, SINGLE], "2\n2") == ["mypy", "PostgreSQL"]


def test_anything_else_is_free_text_kept_as_written() -> None:
    assert kept([SINGLE], "DuckDB, in memory") == ["DuckDB, in memory"]
    assert kept([SINGLE], "  option 2 please ") == ["option 2 please"]


@pytest.mark.parametrize(
    ("asked", "reply", "why"),
    [
        ([SINGLE], "1,2", "takes one option"),
        ([SINGLE], "3", "options 1 to 2"),
        ([SINGLE], "0", "options 1 to 2"),
        ([MULTI, SINGLE], "1", "2 question(s), 1 answer(s)"),
        ([SINGLE], "   ", "1 question(s), 0 answer(s)"),
        ([], "1", "no question"),
        ([SINGLE], "x" * (ANSWERS_LIMIT_BYTES + 1), "up to"),
    ],
)
def test_a_reply_that_does_not_answer_is_refused_with_the_reason(
    asked: list[Question], reply: str, why: str
) -> None:
    with pytest.raises(AnswerError, match=why.replace("(", r"\(").replace(")", r"\)")):
        read_answers(asked, reply)


@given(st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_a_multi_select_answer_names_each_picked_option_once_in_order(picked: list[int]) -> None:
    (answer,) = kept([MULTI], ",".join(map(str, picked)))
    assert answer.split(", ") == [MULTI.options[n - 1] for n in dict.fromkeys(picked)]


def approval(tool: str, tool_input: object, reason: str = "") -> Approval:
    return Approval(
        id=1,
        room=RoomKey(TransportName("console"), RoomId("local")),
        number=4,
        run_id=RunId("run-1"),
        request_id="r",
        tool_name=tool,
        input_json=json.dumps(tool_input),
        state=ApprovalState.PENDING,
        asked_at=0.0,
        expires_at=1.0,
        message_id=None,
        decided_by=None,
        decided_at=None,
        reason=reason,
    )


QUESTION_INPUT = {
    "questions": [
        {"question": "Which database?", "header": "DB", "multiSelect": False,
         "options": [{"label": "SQLite", "description": "a file"}, {"label": "PostgreSQL"}]},
    ]
}  # fmt: skip


def test_an_answered_question_sends_claude_its_questions_and_answers() -> None:
    asked = questions(QUESTION_INPUT)
    answered = approval("AskUserQuestion", QUESTION_INPUT, read_answers(asked, "2"))
    decision = answer_decision(answered, ApprovalChoice.ALLOW)
    assert decision == Allow({**QUESTION_INPUT, "answers": {"Which database?": "PostgreSQL"}})
    assert recorded_answers(QUESTION_INPUT, "not json") == {}


def test_a_plan_is_approved_as_shown_and_with_edits_accepted_only_when_chosen() -> None:
    plan = approval("ExitPlanMode", {"plan": "## do it"})
    assert answer_decision(plan, ApprovalChoice.ALLOW) == Allow({"plan": "## do it"})
    assert answer_decision(plan, ApprovalChoice.ALLOW_SESSION) == Allow(
        {"plan": "## do it"}, (ACCEPT_EDITS,)
    )


def test_a_plan_never_shown_cannot_be_approved_only_sent_back() -> None:
    unseen = approval("ExitPlanMode", {})
    assert "cannot be approved" in str(unanswerable(unseen, ApprovalChoice.ALLOW, ""))
    assert "cannot be approved" in str(unanswerable(unseen, ApprovalChoice.ALLOW_SESSION, ""))
    assert unanswerable(unseen, ApprovalChoice.DENY, "") is None


def test_a_question_needs_answers_not_a_bare_approval() -> None:
    question = approval("AskUserQuestion", QUESTION_INPUT)
    assert unanswerable(question, ApprovalChoice.ALLOW, "") is not None
    assert unanswerable(question, ApprovalChoice.ALLOW_SESSION, '["x"]') is not None
    assert unanswerable(question, ApprovalChoice.ALLOW, '["x"]') is None


def test_the_runs_senders_answer_questions_unless_the_room_keeps_them_to_approvers() -> None:
    default = room(approvers=[BOB])
    assert judge_answer(default, ALICE, {ALICE}) is Verdict.APPROVER  # her run
    assert judge_answer(default, BOB, {ALICE}) is Verdict.APPROVER
    assert judge_answer(default, ALICE, {BOB}) is Verdict.NOT_APPROVER  # not her run
    assert judge_answer(default, EVE, {EVE}) is Verdict.STRANGER  # never a stranger
    strict = room(approvers=[BOB], questions_from="approvers", require_other_approver=True)
    assert judge_answer(strict, ALICE, {ALICE}) is Verdict.NOT_APPROVER
    assert judge_answer(strict, BOB, {BOB}) is Verdict.APPROVER  # a question is no approval


def test_a_reply_of_thousands_of_digits_is_refused_not_a_crash() -> None:
    # int() refuses more than 4300 digits with a plain ValueError.
    with pytest.raises(AnswerError):
        read_answers([SINGLE], "1" * 5000)
    with pytest.raises(AnswerError):
        read_answers([MULTI], "1," + "2" * 5000)


LONG_LABEL = "Yes, deploy to staging" + " " * 300 + "and to production, dropping its database"
LONG_INPUT = {
    "questions": [
        {"question": "Deploy? " + "x" * 400 + " (answer 1 to drop production)",
         "header": "H" * 150, "multiSelect": False,
         "options": [{"label": LONG_LABEL, "description": "d" * 400 + " drops production"},
                     {"label": "No"}]},
    ]
}  # fmt: skip


def test_a_question_shows_every_option_whole_as_its_answer_sends_it() -> None:
    # The answer `1` sends claude the whole label: the room is shown the whole of it,
    # the question and the descriptions too (a long question is posted as a file).
    text = question_text(3, LONG_INPUT, "!", None)
    assert "more characters" not in text
    assert visible(LONG_LABEL) in text
    assert "(answer 1 to drop production)" in text
    assert "drops production" in text
    assert "H" * 150 in text
    asked = questions(LONG_INPUT)
    sent = answer_decision(
        approval("AskUserQuestion", LONG_INPUT, read_answers(asked, "1")), ApprovalChoice.ALLOW
    )
    assert isinstance(sent, Allow)
    assert list(sent.updated_input["answers"].values()) == [LONG_LABEL]


def test_a_plan_is_approved_with_the_plan_shown_and_nothing_else() -> None:
    # The plan's message shows only `plan`: any other field of the tool use (one the
    # CLI reads, like `planFilePath`) would be approved unseen.
    plan = approval("ExitPlanMode", {"plan": "## do it", "planFilePath": "/srv/other-plan.md"})
    assert answer_decision(plan, ApprovalChoice.ALLOW) == Allow({"plan": "## do it"})
    assert answer_decision(plan, ApprovalChoice.ALLOW_SESSION) == Allow(
        {"plan": "## do it"}, (ACCEPT_EDITS,)
    )

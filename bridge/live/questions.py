"""claude's questions (AskUserQuestion) and plans (ExitPlanMode) as requests to the room.

Both come as tool-use requests (docs/live-runs.md, "Questions and plans") and
are kept, posted and answered like any other (:mod:`bridge.live.approval_flow`);
this module holds what differs, as pure rules: how they are shown, how a
person's reply is read, who may answer, and what claude is sent back.

What the real CLI expects (pinned in tests/runner/test_questions_real.py):
a question is answered by allowing it with ``updatedInput`` carrying
``answers`` (question text -> answer text, several choices joined by
``", "``); a plan is approved by allowing it with the plan, kept planning
by denying it with the person's feedback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.core.duration import format_duration
from bridge.core.transport import ApprovalChoice, Asked, AskedQuestion, AskKind
from bridge.live.approval_text import (
    code_block,
    code_span,
    outcome_text,
    parse_input,
)
from bridge.live.approvals import deny_message
from bridge.store.base import Approval, ApprovalState
from runner.control import Allow

ASK = "AskUserQuestion"
PLAN = "ExitPlanMode"
INTERACTIVE = frozenset({ASK, PLAN})
"""Tools that ask a person rather than act: answered with words, not allowed blind."""

ACCEPT_EDITS = {"type": "setMode", "mode": "acceptEdits", "destination": "session"}
"""The permission update "start with edits accepted" sends with the plan's approval."""

DECLINED = "The user declined to answer these questions. Go on without the answers, or ask in text."

NO_EXPIRY_S = 100 * 365 * 86400.0
"""The wait of a question or plan with no ``question_timeout_s``: kept as a far expiry,
so the store's one expiry rule serves every request."""

KEEP_PLANNING = "The user wants you to keep planning; the plan is not approved yet."
"""What claude is told of a plan sent back without feedback."""

_CHOICES = re.compile(r"[0-9]{1,9}(\s*,\s*[0-9]{1,9})*")
"""Option numbers (more digits than any option could have are free text, never an int
conversion Python refuses)."""


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    header: str
    options: tuple[str, ...]
    """The options' labels, in order (numbered from 1 in the room)."""
    descriptions: tuple[str, ...]
    multi: bool


def questions(tool_input: Mapping[str, Any]) -> list[Question]:
    """The questions of an AskUserQuestion input (malformed entries are skipped)."""
    found = []
    for entry in tool_input.get("questions") or ():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("question"), str):
            continue
        options = [o for o in entry.get("options") or () if isinstance(o, Mapping)]
        found.append(
            Question(
                text=entry["question"],
                header=str(entry.get("header") or ""),
                options=tuple(str(o.get("label", "")) for o in options),
                descriptions=tuple(str(o.get("description") or "") for o in options),
                multi=bool(entry.get("multiSelect")),
            )
        )
    return found


def asked_of(approval: Approval) -> Asked:
    """What a question or plan asks, for the transport's own actions (buttons, reactions)."""
    if approval.tool_name == PLAN:
        return Asked(AskKind.PLAN)
    asked = questions(parse_input(approval.input_json))
    return Asked(AskKind.QUESTION, tuple(AskedQuestion(q.options, q.multi) for q in asked))


def plan_of(tool_input: Mapping[str, Any]) -> str:
    """The plan's Markdown; empty when the request does not hold it (never shown)."""
    plan = tool_input.get("plan")
    return plan if isinstance(plan, str) else ""


class AnswerError(ValueError):
    """A reply that does not answer the questions; its text says why, for the room."""


ANSWERS_LIMIT_BYTES = 1000
"""The answers are kept with the request's decision (its reason, 1 KiB): a longer reply is
refused, never cut, so claude gets what the person wrote."""


def read_answers(asked: Sequence[Question], reply: str) -> str:
    """A person's reply as the answers to keep (a JSON list, one per question): one part per
    question (``;`` or a new line between parts), each option numbers (``2``, ``1,3``) or
    free text."""
    if not asked:
        raise AnswerError("This request holds no question to answer.")
    parts = [p.strip() for p in re.split(r"[;\n]", reply)] if len(asked) > 1 else [reply.strip()]
    parts = [p for p in parts if p]
    if len(parts) != len(asked):
        raise AnswerError(
            f"{len(asked)} question(s), {len(parts)} answer(s): give one per question,"
            " separated by `;`."
        )
    answers = [
        _answer(number, question, part)
        for number, (question, part) in enumerate(zip(asked, parts, strict=True), 1)
    ]
    kept = json.dumps(answers, ensure_ascii=False)
    if len(kept.encode()) > ANSWERS_LIMIT_BYTES:
        raise AnswerError(f"Answers are kept up to {ANSWERS_LIMIT_BYTES} bytes: say it shorter.")
    return kept


def recorded_answers(tool_input: Mapping[str, Any], kept: str) -> dict[str, str]:
    """The answers kept as ``kept`` by question text, the form claude reads."""
    try:
        answers = json.loads(kept)
    except ValueError:
        return {}
    if not isinstance(answers, list):
        return {}
    asked = questions(tool_input)
    return {q.text: str(a) for q, a in zip(asked, answers, strict=False)}


def _answer(number: int, question: Question, part: str) -> str:
    if _CHOICES.fullmatch(part) is None:
        return part  # free text ("Other")
    picked = [int(n) for n in part.split(",")]
    if any(not 1 <= n <= len(question.options) for n in picked):
        raise AnswerError(
            f"Question {number} has options 1 to {len(question.options)}: `{part}` is not one."
        )
    if len(picked) > 1 and not question.multi:
        raise AnswerError(f"Question {number} takes one option, not `{part}`.")
    labels = dict.fromkeys(question.options[n - 1] for n in picked)
    return ", ".join(labels)


def answered_input(tool_input: Mapping[str, Any], kept: str) -> dict[str, Any]:
    """The ``updatedInput`` that gives claude the answers kept as ``kept``."""
    return {**tool_input, "answers": recorded_answers(tool_input, kept)}


def question_text(
    number: int,
    tool_input: Mapping[str, Any],
    prefix: str,
    timeout_s: float | None,
    limit: int | None = None,
) -> str:
    """The message asking the room claude's questions, options numbered: every text whole
    (an answer sends claude the whole label), or each cut to ``limit`` characters, saying
    so, when the whole was posted before as a file."""
    asked = questions(tool_input)
    lines = [f"Claude asks (question `#{number}`):"]
    for index, question in enumerate(asked, 1):
        head = f"**{index}.** " if len(asked) > 1 else ""
        kind = " (one or more)" if question.multi else ""
        header = f"[{code_span(question.header, limit)}] " if question.header else ""
        lines.append(f"{head}{header}{code_span(question.text, limit)}{kind}")
        for option, (label, description) in enumerate(
            zip(question.options, question.descriptions, strict=True), 1
        ):
            about = f": {code_span(description, limit)}" if description else ""
            lines.append(f"    {option}. {code_span(label, limit)}{about}")
    several = " (one answer per question, separated by `;`)" if len(asked) > 1 else ""
    lines.append(
        f"Answer `{prefix}answer #{number} 1` (an option), `{prefix}answer #{number} 1,3`"
        f" (several, where allowed) or `{prefix}answer #{number} your own words`{several};"
        f" `{prefix}deny #{number}` declines." + _expiry(timeout_s)
    )
    return "\n".join(lines)


def _expiry(timeout_s: float | None) -> str:
    return f" Unanswered, it is declined in {format_duration(timeout_s)}." if timeout_s else ""


def plan_request_text(
    number: int, tool_input: Mapping[str, Any], prefix: str, timeout_s: float | None
) -> str:
    """The message showing claude's plan in full and the three ways on."""
    plan = plan_of(tool_input)
    if not plan:
        return (
            f"Claude asks to end planning (plan `#{number}`), but its plan was not found:"
            f" it cannot be approved. `{prefix}deny #{number} feedback` sends claude back"
            " to planning."
        )
    return "\n".join(
        [
            f"Claude proposes this plan (plan `#{number}`):",
            code_block(plan, "markdown"),
            f"`{prefix}approve #{number}`: start, each edit asked one by one;"
            f" `{prefix}approve edits #{number}`: start with edits accepted;"
            f" `{prefix}deny #{number} feedback`: keep planning (claude reads the feedback)."
            + _expiry(timeout_s),
        ]
    )


def answer_line(tool_input: Mapping[str, Any], kept: str) -> str:
    """``"Which DB?" → PostgreSQL``: the kept answers, for the question's edit."""
    answers = recorded_answers(tool_input, kept)
    return "; ".join(f"{code_span(q)} → {code_span(a)}" for q, a in answers.items())


def outcome(approval: Approval) -> str:
    """What became of a request, question or plan (its message's edit, a command's answer)."""
    if approval.tool_name not in INTERACTIVE:
        return outcome_text(approval)
    kind = "Question" if approval.tool_name == ASK else "Plan"
    line = f"{kind} `#{approval.number}`: "
    by = f" by {code_span(approval.decided_by, 100)}" if approval.decided_by is not None else ""
    match approval.state:
        case ApprovalState.ALLOWED if approval.tool_name == ASK:
            line += (
                f"answered{by}: {answer_line(parse_input(approval.input_json), approval.reason)}"
            )
        case ApprovalState.ALLOWED:
            line += f"approved{by}: claude starts, each edit asked one by one"
        case ApprovalState.ALLOWED_SESSION:
            line += f"approved{by}: claude starts with edits accepted"
        case ApprovalState.DENIED if approval.tool_name == PLAN:
            feedback = f": {code_span(approval.reason)}" if approval.reason else ""
            line += f"sent back to planning{by}{feedback}"
        case ApprovalState.DENIED:
            line += f"declined{by}"
        case ApprovalState.EXPIRED:
            line += "declined: nobody answered in time"
        case ApprovalState.CANCELLED:
            line += f"cancelled: {approval.reason or 'the run ended'}"
        case _:
            line += "waiting for an answer"
    return line + "."


def deny_text(tool_name: str, reason: str) -> str:
    """What claude is told when a question is declined or a plan sent back."""
    if tool_name == PLAN:
        reason = reason.strip()
        return f"The user wants you to keep planning: {reason}" if reason else KEEP_PLANNING
    if tool_name == ASK:
        reason = reason.strip()
        return f"The user declined to answer: {reason}" if reason else DECLINED
    return deny_message(reason)


def request_message(
    approval: Approval, prefix: str, timeout_s: float | None, limit: int | None = None
) -> str:
    """The message asking the room: a question or a plan (a tool use's is
    :func:`bridge.live.approval_text.request_text`, shown through bridge/live/tool_view.py);
    ``limit``: a question's texts cut to that, once its whole was posted."""
    tool_input = parse_input(approval.input_json)
    if approval.tool_name == ASK:
        return question_text(approval.number, tool_input, prefix, timeout_s, limit)
    return plan_request_text(approval.number, tool_input, prefix, timeout_s)


def answer_decision(approval: Approval, choice: ApprovalChoice) -> Allow:
    """What claude is sent for an answered question or an approved plan (``choice`` is
    ALLOW, or ALLOW_SESSION: a plan started with edits accepted)."""
    tool_input = parse_input(approval.input_json)
    if approval.tool_name == ASK:
        return Allow(answered_input(tool_input, approval.reason))
    # The plan as shown, and nothing else of the tool use (its message shows no other field).
    shown = {"plan": plan_of(tool_input)}
    if choice is ApprovalChoice.ALLOW_SESSION:
        return Allow(shown, (ACCEPT_EDITS,))
    return Allow(shown)


def unanswerable(approval: Approval, choice: ApprovalChoice, reason: str) -> str | None:
    """Why ``choice`` cannot answer ``approval`` (for the person), or None when it can.

    A plan is approved only as it was shown (its request holds the plan); a question
    is answered with answers (``!answer``), never with a bare approval.
    """
    if choice is ApprovalChoice.DENY:
        return None
    number = f"`#{approval.number}`"
    if approval.tool_name == PLAN and not plan_of(parse_input(approval.input_json)):
        return (
            f"Plan {number} was never shown (claude's plan was not found): it cannot be approved."
        )
    if approval.tool_name == ASK and not reason:
        return f"Question {number} wants an answer: say it with `answer {number} ...`."
    if approval.tool_name == ASK and choice is not ApprovalChoice.ALLOW:
        return f"Question {number} is answered with `answer {number} ...`."
    return None

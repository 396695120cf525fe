"""Who may answer tool requests, and how a request reads in the room."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.core.model import RunId, UserId
from bridge.live.approval_text import (
    code_block,
    code_span,
    outcome_text,
    parse_input,
    request_text,
)
from bridge.live.approvals import (
    DEFAULT_DENIAL,
    Verdict,
    deny_message,
    judge,
    may_approve,
    refusal,
    timeout_message,
)
from bridge.live.tool_view import render
from bridge.store.base import Approval, ApprovalState
from tests.bridge.approval_rooms import ALICE, BOB, CAROL, EVE, ROOM, room


def approval(tool: str, tool_input: object, **fields: object) -> Approval:
    values: dict[str, object] = {
        "id": 1,
        "room": ROOM,
        "number": 7,
        "run_id": RunId("run-1"),
        "request_id": "req-1",
        "tool_name": tool,
        "input_json": json.dumps(tool_input),
        "asked_at": 100.0,
        "expires_at": 1000.0,
        "message_id": None,
        "state": ApprovalState.PENDING,
        "decided_by": None,
        "decided_at": None,
        "reason": "",
    }
    values.update(fields)
    return Approval(**values)  # type: ignore[arg-type]


def asked(request: Approval, timeout_s: float = 60) -> str:
    """The request's text as the room is shown it whole."""
    view = render(request.tool_name, parse_input(request.input_json))
    return request_text(request, "!", timeout_s, view.markdown())


@pytest.mark.parametrize(
    ("overrides", "sender", "batch", "verdict"),
    [
        ({}, ALICE, {ALICE}, Verdict.APPROVER),
        ({}, EVE, set(), Verdict.STRANGER),
        ({"approvers": [BOB]}, BOB, set(), Verdict.APPROVER),
        ({"approvers": [BOB]}, ALICE, set(), Verdict.NOT_APPROVER),
        ({"approvers": [EVE]}, EVE, set(), Verdict.APPROVER),
        ({"require_other_approver": True}, ALICE, {ALICE, CAROL}, Verdict.OWN_RUN),
        ({"require_other_approver": True}, BOB, {ALICE, CAROL}, Verdict.APPROVER),
        # "*": anyone allowed in the room (docs/configuration.md), not strangers too.
        ({"approvers": ["*"]}, EVE, set(), Verdict.STRANGER),
        ({"approvers": ["*"]}, CAROL, set(), Verdict.APPROVER),
        ({"allowed_users": ["*"], "approvers": [BOB]}, EVE, set(), Verdict.NOT_APPROVER),
    ],
)
def test_who_may_answer(
    overrides: dict[str, object], sender: UserId, batch: set[UserId], verdict: Verdict
) -> None:
    settings = room(**overrides)
    assert judge(settings, sender, batch) is verdict
    assert may_approve(settings, sender, batch) is (verdict is Verdict.APPROVER)


def test_only_allowed_users_hear_why_they_were_refused() -> None:
    assert refusal(Verdict.STRANGER) is None
    assert refusal(Verdict.APPROVER) is None
    assert "not an approver" in (refusal(Verdict.NOT_APPROVER) or "")
    assert "another approver" in (refusal(Verdict.OWN_RUN) or "")


def test_what_claude_is_told_of_a_denial() -> None:
    assert deny_message("  ") == DEFAULT_DENIAL
    assert deny_message("use the staging db") == "The user denied this tool use: use the staging db"
    assert "timed out" in timeout_message(900)
    assert "15m00s" in timeout_message(900)


def test_a_bash_request_shows_the_command_and_how_to_answer() -> None:
    text = asked(approval("Bash", {"command": "rm -rf build/"}), 900)
    assert "```sh\nrm -rf build/\n```" in text
    assert "`#7`" in text
    assert "`run-1`" in text
    for how in ("`!approve #7`", "`!approve session #7`", "`!deny #7 reason`"):
        assert how in text
    assert "15m00s" in text


def test_an_edit_of_a_file_it_cannot_read_shows_the_replacement_saying_why() -> None:
    edit = {"file_path": "src/app.py", "old_string": "a = 1\nb = 2", "new_string": "a = 1\nb = 3"}
    text = asked(approval("Edit", edit), 900)
    assert "File: `src/app.py`" in text
    assert "the file could not be read" in text
    assert "-b = 2\n+b = 3" in text


def test_a_big_write_is_shown_whole() -> None:
    content = "\n".join(f"line {i}" for i in range(500))
    text = asked(approval("Write", {"file_path": "f", "content": content}))
    assert "line 0\n" in text
    assert "line 499\n" in text
    assert "more lines" not in text


def test_multiedit_shows_every_edit() -> None:
    edits = [{"old_string": "a", "new_string": "b"}, {"old_string": "c", "new_string": "d"}]
    text = asked(approval("MultiEdit", {"file_path": "f", "edits": edits}), 60)
    assert "-a\n+b" in text
    assert "-c\n+d" in text


@pytest.mark.parametrize(
    ("tool", "tool_input", "shown"),
    [
        ("WebFetch", {"url": "https://example.org/x", "prompt": "p"}, "`https://example.org/x`"),
        ("WebSearch", {"query": "chatbridge"}, "`chatbridge`"),
        ("mcp__db__query", {"sql": "select 1"}, "sql: `select 1`"),
    ],
)
def test_other_tools_show_their_target_or_input(tool: str, tool_input: object, shown: str) -> None:
    assert shown in asked(approval(tool, tool_input), 60)


def test_hostile_input_cannot_leave_its_code_or_hide_characters() -> None:
    command = "echo ```\n@room **APPROVED** <!channel> [x](https://evil)\u202egnp.exe\u200b"
    text = asked(approval("Bash", {"command": command}), 60)
    # The fence is longer than any backtick run inside: nothing ends the block early.
    assert "````sh\n" in text
    assert "\\u{202e}" in text
    assert "\\u{200b}" in text
    assert "\u202e" not in text
    url = "https://x/`) [click](https://evil)\n!approve #1"
    fetched = asked(approval("WebFetch", {"url": url}), 60)
    # A line break makes it a block: shown as it is, inside a fence nothing closes.
    assert "url:\n```\nhttps://x/`) [click](https://evil)\n!approve #1\n```" in fetched


@given(st.text(max_size=60))
def test_a_code_span_is_one_span_whatever_its_text(text: str) -> None:
    span = code_span(text)
    ticks = re.match(r"`+", span)
    assert ticks is not None
    delimiter = ticks.group(0)
    inner = span[len(delimiter) : -len(delimiter)]
    assert span.endswith(delimiter)
    # No run of exactly the delimiter's length inside: CommonMark cannot close it early.
    assert all(len(run) != len(delimiter) for run in re.findall(r"`+", inner))
    assert "\n" not in span


@given(st.text(max_size=80))
def test_a_code_block_is_one_block_whatever_its_text(text: str) -> None:
    block = code_block(text)
    fence = block.split("\n", 1)[0]
    body = block[len(fence) + 1 : -len(fence) - 1]
    assert block.endswith("\n" + fence)
    assert all(not line.strip().startswith(fence) for line in body.split("\n"))


def test_outcome_lines() -> None:
    denied = approval("Bash", {}, state=ApprovalState.DENIED, decided_by=BOB, reason="not on prod")
    assert outcome_text(denied) == ("Request `#7` (`Bash`): denied by `@bob:x` (`not on prod`).")
    expired = approval("Bash", {}, state=ApprovalState.EXPIRED)
    assert "nobody answered in time" in outcome_text(expired)

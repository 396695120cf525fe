"""Approval requests' blocks and the reading of clicks, without a peer."""

from __future__ import annotations

from typing import Any

from bridge.core.model import ExternalMessageId, RoomId, RoomKey, TransportName, UserId
from bridge.core.transport import ApprovalAction, ApprovalChoice, Asked, AskedQuestion, AskKind
from transports.slack.approvals import (
    SECTION_LIMIT,
    approval_fits,
    fitted,
    request_blocks,
    to_action,
)

ROOMS = frozenset({"C1"})


def click(**overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "type": "block_actions",
        "user": {"id": "U1", "name": "alice"},
        "container": {"type": "message", "message_ts": "111.222", "channel_id": "C1"},
        "channel": {"id": "C1", "name": "general"},
        "message": {"ts": "111.222"},
        "actions": [{"action_id": "chatbridge_approval_deny", "value": "#1", "type": "button"}],
    }
    payload.update(overrides)
    return payload


def test_a_click_is_read_as_the_choice_of_the_user_on_the_message() -> None:
    assert to_action(click(), "UBOT", ROOMS) == ApprovalAction(
        RoomKey(TransportName("slack"), RoomId("C1")),
        UserId("U1"),
        ExternalMessageId("111.222"),
        ApprovalChoice.DENY,
    )


def test_clicks_not_for_the_bridge_are_dropped() -> None:
    assert to_action(click(type="view_submission"), "UBOT", ROOMS) is None
    assert to_action(click(user={"id": "UBOT"}), "UBOT", ROOMS) is None
    assert to_action(click(user={"id": "U2", "is_bot": True}), "UBOT", ROOMS) is None
    assert to_action(click(channel={"id": "C2"}), "UBOT", ROOMS) is None
    assert to_action(click(actions=[{"action_id": "other"}]), "UBOT", ROOMS) is None
    assert to_action(click(actions=[{"action_id": "chatbridge_approval_x"}]), "UBOT", ROOMS) is None
    assert to_action(click(container={}, message={}), "UBOT", ROOMS) is None


def test_a_long_request_is_cut_to_fit_a_section() -> None:
    text = "Claude wants to write:\n\n" + "<&> " * 5000
    shown = fitted(text)
    assert len(shown) <= SECTION_LIMIT
    assert shown.endswith("\n…")
    assert "<&>" not in shown
    section = request_blocks(shown, "#1")[0]
    assert section["text"]["text"] == shown
    assert fitted("short") == "short"


def test_a_request_is_measured_after_escaping() -> None:
    # 2,000 characters that escaping makes 5,000: it does not fit one section.
    text = "```sh\n" + "a && " * 400 + "\n```"
    assert len(text) < SECTION_LIMIT
    assert not approval_fits(text)
    assert approval_fits("```sh\n" + "a and " * 400 + "\n```")


SINGLE = Asked(AskKind.QUESTION, (AskedQuestion(("SQLite", "PostgreSQL"), False),))
TWO = Asked(
    AskKind.QUESTION,
    (
        AskedQuestion(("ruff", "mypy", "pytest"), True),
        AskedQuestion(("SQLite", "PostgreSQL"), False),
    ),
)


def elements(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for b in blocks if b["type"] == "actions" for e in b["elements"]]


def test_a_single_choice_question_offers_one_button_per_option_and_no_allow() -> None:
    shown = elements(request_blocks("q", "#4", SINGLE))
    assert [e["action_id"] for e in shown] == [
        "chatbridge_approval_option_1",
        "chatbridge_approval_option_2",
    ]
    assert [e["text"]["text"] for e in shown] == ["1. SQLite", "2. PostgreSQL"]
    assert {e["value"] for e in shown} == {"#4"}


def test_a_multi_select_question_offers_checkboxes_and_an_answer_button() -> None:
    shown = elements(request_blocks("q", "#4", TWO))
    assert [e["type"] for e in shown] == ["checkboxes", "radio_buttons", "button"]
    assert [o["value"] for o in shown[0]["options"]] == ["1", "2", "3"]
    assert shown[2]["action_id"] == "chatbridge_approval_submit"


def test_a_plan_offers_start_with_edits_asked_or_accepted_and_keep_planning() -> None:
    shown = elements(request_blocks("p", "#2", Asked(AskKind.PLAN)))
    assert [e["text"]["text"] for e in shown] == [
        "Start, edits asked",
        "Start, edits accepted",
        "Keep planning",
    ]


def test_an_option_button_is_read_as_that_answer() -> None:
    action = to_action(
        click(actions=[{"action_id": "chatbridge_approval_option_2", "value": "#1"}]), "UBOT", ROOMS
    )
    assert action is not None
    assert (action.choice, action.answer, action.guide) == (ApprovalChoice.ALLOW, "2", False)


def test_the_answer_button_reads_the_checkboxes_and_radio_groups_picked() -> None:
    state = {
        "values": {
            "chatbridge_pick_1": {
                "chatbridge_pick_1": {
                    "type": "checkboxes",
                    "selected_options": [{"value": "1"}, {"value": "3"}],
                }
            },
            "chatbridge_pick_2": {
                "chatbridge_pick_2": {"type": "radio_buttons", "selected_option": {"value": "2"}}
            },
        }
    }
    submit = [{"action_id": "chatbridge_approval_submit", "value": "#1"}]
    action = to_action(click(actions=submit, state=state), "UBOT", ROOMS)
    assert action is not None
    assert (action.choice, action.answer) == (ApprovalChoice.ALLOW, "1,3; 2")
    # Nothing picked for the first: its part is empty, so the bridge asks for one per question.
    del state["values"]["chatbridge_pick_1"]
    action = to_action(click(actions=submit, state=state), "UBOT", ROOMS)
    assert action is not None
    assert action.answer == "; 2"


def test_keep_planning_is_read_as_a_request_for_guidance_not_a_decision() -> None:
    keep = [{"action_id": "chatbridge_approval_keep_planning", "value": "#1"}]
    action = to_action(click(actions=keep), "UBOT", ROOMS)
    assert action is not None
    assert action.guide

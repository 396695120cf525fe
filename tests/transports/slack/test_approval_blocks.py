"""Approval requests' blocks and the reading of clicks, without a peer."""

from __future__ import annotations

from typing import Any

from bridge.core.model import ExternalMessageId, RoomId, RoomKey, TransportName, UserId
from bridge.core.transport import ApprovalAction, ApprovalChoice
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

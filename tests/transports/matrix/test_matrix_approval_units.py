"""Reactions read as approval actions, without a server."""

from __future__ import annotations

from typing import Any

import pytest
from nio import Event

from bridge.core.model import ExternalMessageId, RoomId, RoomKey, TransportName, UserId
from bridge.core.transport import ApprovalAction, ApprovalChoice, Asked, AskedQuestion, AskKind
from transports.matrix.approvals import (
    HOWTO,
    NUMBERS,
    WIDEST_HOWTO,
    KnownRequests,
    choice_of,
    number_of,
    offered,
)
from transports.matrix.inbound import InboundPolicy, to_inbound

BOT = InboundPolicy("@bot:hs", ignore_other_bots=True, ignore_users=frozenset({"@ci:hs"}))


def reaction(key: str, sender: str = "@alice:hs", target: str = "$request") -> Any:
    return Event.parse_event(
        {
            "type": "m.reaction",
            "event_id": "$r1",
            "sender": sender,
            "origin_server_ts": 1,
            "content": {
                "m.relates_to": {"rel_type": "m.annotation", "event_id": target, "key": key}
            },
        }
    )


@pytest.mark.parametrize(
    ("key", "choice"),
    [
        ("✅", ApprovalChoice.ALLOW),
        ("✅\ufe0f", ApprovalChoice.ALLOW),
        ("🔁", ApprovalChoice.ALLOW_SESSION),
        ("❌", ApprovalChoice.DENY),
    ],
)
def test_the_three_reactions_are_the_three_choices(key: str, choice: ApprovalChoice) -> None:
    assert choice_of(key) is choice
    assert to_inbound(reaction(key), "!r", BOT) == ApprovalAction(
        RoomKey(TransportName("matrix"), RoomId("!r")),
        UserId("@alice:hs"),
        ExternalMessageId("$request"),
        choice,
    )


def test_other_reactions_and_those_of_the_bot_or_ignored_users_are_nothing() -> None:
    assert to_inbound(reaction("👍"), "!r", BOT) is None
    assert to_inbound(reaction("✅", sender="@bot:hs"), "!r", BOT) is None
    assert to_inbound(reaction("✅", sender="@ci:hs"), "!r", BOT) is None


def test_known_requests_are_bounded() -> None:
    known = KnownRequests(size=2)
    known.note("$a", True)
    known.reactions["$a"] = ["$ra"]
    known.note("$b", False)
    known.note("$c", True)
    assert (known.get("$a"), known.get("$b"), known.get("$c")) == (None, False, True)
    assert "$a" not in known.reactions


def test_number_reactions_are_read_as_options_and_other_keys_are_not() -> None:
    assert number_of("2\ufe0f\u20e3") == "2"
    assert number_of("9\u20e3") == "9"
    assert number_of("0\ufe0f\u20e3") is None
    assert number_of("✅") is None


def test_a_question_and_a_plan_say_how_they_are_answered_not_how_tools_are() -> None:
    one = Asked(AskKind.QUESTION, (AskedQuestion(("a", "b", "c"), False),))
    keys, howto = offered(one)
    assert keys == NUMBERS[:3]
    assert "allow" not in howto
    assert "Reply to this message" in howto
    multi = Asked(AskKind.QUESTION, (AskedQuestion(("a", "b"), True),))
    assert offered(multi)[0] == ()
    keys, howto = offered(Asked(AskKind.PLAN))
    assert keys == ("✅", "🔁", "❌")
    assert "keep planning" in howto
    assert offered(Asked())[1] == HOWTO
    assert all(len(h) <= len(WIDEST_HOWTO) for h in (offered(one)[1], offered(multi)[1]))


def test_known_requests_keep_their_kind() -> None:
    known = KnownRequests()
    known.note("$q", True, "question")
    known.note("$x", False)
    assert known.kind("$q") == "question"
    assert known.kind("$x") == ""
    assert known.kind("$y") is None
    assert known.get("$q") is True

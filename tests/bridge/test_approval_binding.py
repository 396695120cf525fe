"""An answer applies to the input the room was shown, and refusals reach the person."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from bridge.core.model import Batch, ExternalMessageId, Reply
from bridge.core.transport import TOOL_ASKED, Accepted, ApprovalChoice, Asked
from bridge.live.approval_flow import CHANGED, STALE
from bridge.outbound.replies import Replier
from bridge.store.base import NewRule, RuleEffect, RuleScope
from runner.events import PermissionAsked
from tests.bridge.approval_posts import RUN, Bound, Told


async def test_an_allow_sends_back_the_input_shown_not_another(tmp_path: Path) -> None:
    bound = Bound(tmp_path)
    await bound.asks(bound.asked)  # shown: `ls`
    # The same request again (a replay) with another input: nobody was shown it.
    other = PermissionAsked("r1", "Bash", {"command": "rm -rf /"}, "tu1", "rm", ())
    await bound.asks(other)
    assert await bound.flow.on_action(bound.act(ApprovalChoice.ALLOW)) is Accepted.ACCEPTED
    [answer] = bound.answers()
    assert answer == {"behavior": "deny", "message": CHANGED}


async def test_an_allow_sends_back_exactly_what_was_shown(tmp_path: Path) -> None:
    bound = Bound(tmp_path)
    await bound.asks(bound.asked)
    await bound.flow.on_action(bound.act(ApprovalChoice.ALLOW))
    [answer] = bound.answers()
    assert answer == {"behavior": "allow", "updatedInput": {"command": "ls"}}


async def test_a_click_too_late_is_answered_to_the_person(tmp_path: Path) -> None:
    bound = Bound(tmp_path)
    await bound.asks(bound.asked)
    await bound.flow.on_action(bound.act(ApprovalChoice.DENY))
    assert bound.told.told == []  # a decision shows on the request itself
    await bound.flow.on_action(bound.act(ApprovalChoice.ALLOW))
    [(action, text)] = bound.told.told
    assert action.choice is ApprovalChoice.ALLOW
    assert text.startswith("Already answered.")
    assert len(bound.answers()) == 1


class Room(Told):
    """Also keeps what the room was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    async def send(self, reply: Reply) -> None:
        self.sent.append(reply.text)


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (
            PermissionAsked("r1", "Bash", {"command": "printf 'a\0b'"}, "tu1", "", ()),
            "binary data",
        ),
        (
            PermissionAsked("r1", "SomeDialog", {}, "tu1", "", (), requires_user_interaction=True),
            "only its own user interface",
        ),
        # The real CLI asks ExitPlanMode with input {}: the plan is elsewhere, and an
        # allow would end plan mode on a plan nobody was shown.
        (
            PermissionAsked(
                "r1", "ExitPlanMode", {}, "tu1", "", (), requires_user_interaction=True
            ),
            "the plan is not in the request",
        ),
    ],
)
async def test_what_cannot_be_shown_faithfully_is_denied_unasked(
    tmp_path: Path, event: PermissionAsked, why: str
) -> None:
    bound = Bound(tmp_path)
    room = Room()
    bound.flow.replier = cast(Replier, room)
    await bound.asks(event)
    assert not room.posted.is_set()  # never offered for approval
    [said] = room.sent
    assert "denied without asking" in said
    assert why in said
    [answer] = bound.answers()
    assert isinstance(answer, dict)
    assert answer["behavior"] == "deny"
    assert why in str(answer["message"])
    assert await bound.store.pending_approvals() == []


async def test_an_edit_of_a_file_changed_since_it_was_shown_is_not_allowed(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "app.conf"
    conf.write_text("debug = false\n")
    edit = {"file_path": str(conf), "old_string": "debug", "new_string": "trace"}
    bound = Bound(tmp_path)
    await bound.asks(PermissionAsked("r1", "Edit", edit, "tu1", "", ()))
    # Shown: one line changes. Now the same edit would change two.
    conf.write_text("debug = false\ndebug_port = 1\n")
    await bound.flow.on_action(bound.act(ApprovalChoice.ALLOW))
    [answer] = bound.answers()
    assert answer == {"behavior": "deny", "message": STALE}


async def test_an_edit_of_an_unchanged_file_is_allowed_as_shown(tmp_path: Path) -> None:
    conf = tmp_path / "app.conf"
    conf.write_text("debug = false\n")
    edit = {"file_path": str(conf), "old_string": "debug", "new_string": "trace"}
    bound = Bound(tmp_path)
    await bound.asks(PermissionAsked("r1", "Edit", edit, "tu1", "", ()))
    await bound.flow.on_action(bound.act(ApprovalChoice.ALLOW))
    [answer] = bound.answers()
    assert answer == {"behavior": "allow", "updatedInput": edit}


class Narrow(Room):
    """A chat whose request message holds ``limit`` characters; files post."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.requests: list[str] = []
        self.files: list[str] = []

    def approval_fits(self, room: object, text: str) -> bool:
        return len(text) <= self.limit

    async def post_file(self, reply: Reply, key: str) -> bool:
        assert reply.file is not None
        self.files.append(Path(reply.file).read_text())
        return True

    async def post_approval(
        self, request: Reply, ref: str, asked: Asked = TOOL_ASKED
    ) -> ExternalMessageId | None:
        self.requests.append(request.text)
        return await super().post_approval(request, ref)


async def test_a_request_of_many_short_fields_is_never_cut_unsaid(tmp_path: Path) -> None:
    # Each field is short, so none is shortened; together they do not fit: the request
    # must not go out for the transport to cut (the last fields, the answer line).
    fields: dict[str, object] = {f"field_{i:02d}": "v" * 150 for i in range(30)}
    fields["bcc"] = "everyone@evil.example"
    bound = Bound(tmp_path)
    room = Narrow(3000)
    bound.flow.replier = cast(Replier, room)
    await bound.asks(PermissionAsked("r1", "mcp__mail__send", fields, "tu1", "", ()))
    [whole] = room.files
    assert "everyone@evil.example" in whole
    [request] = room.requests
    assert len(request) <= room.limit
    assert "approve #1" in request
    assert "everyone@evil.example" in request or "not shown here" in request


class Down(Room):
    """A chat that takes notices but not the request (a post failing after its retries)."""

    async def post_approval(
        self, request: Reply, ref: str, asked: Asked = TOOL_ASKED
    ) -> ExternalMessageId | None:
        self.posted.set()
        return None


async def test_a_request_the_room_could_not_be_posted_is_denied_not_left_to_approve_blind(
    tmp_path: Path,
) -> None:
    # Left waiting, it would be listed by !status ("approve #N") and answerable by
    # command, though nobody was ever shown what it runs.
    bound = Bound(tmp_path)
    room = Down()
    bound.flow.replier = cast(Replier, room)
    await bound.asks(bound.asked)
    assert await bound.store.pending_approvals() == []
    [answer] = bound.answers()
    assert isinstance(answer, dict)
    assert answer["behavior"] == "deny"
    [said] = room.sent
    assert "denied without asking" in said


class Gated(Narrow):
    """Reads a posted file only once every file of the test is written."""

    def __init__(self, limit: int, files: int) -> None:
        super().__init__(limit)
        self.waiting = files
        self.all_written = asyncio.Event()

    async def post_file(self, reply: Reply, key: str) -> bool:
        self.waiting -= 1
        if not self.waiting:
            self.all_written.set()
        await self.all_written.wait()
        return await super().post_file(reply, key)


async def test_two_conversations_requests_of_one_number_post_each_its_own_whole(
    tmp_path: Path,
) -> None:
    # Numbers count per conversation: two threads both have a request #1, posted whole
    # at once. Each thread must get its own, never the other's (another room's text).
    bound = Bound(tmp_path)
    room = Gated(3000, files=2)
    bound.flow.replier = cast(Replier, room)
    asks = []
    for thread in ("t1", "t2"):
        key = replace(bound.key, thread=thread)
        message = replace(bound.batch.messages[0], room=key, thread=thread)
        event = PermissionAsked("r1", "Bash", {"command": f"echo {thread} " * 500}, "tu", "", ())
        asks.append(bound.flow.ask(RUN, Batch(key, (message,)), event))
    await asyncio.gather(*asks)
    assert sorted(("echo t1" in whole, "echo t2" in whole) for whole in room.files) == [
        (False, True),
        (True, False),
    ]


async def test_a_question_declined_by_a_rule_kept_meanwhile_is_told_as_a_declined_question(
    tmp_path: Path,
) -> None:
    # Decided by a rule at the ask or by one kept while it waits: claude reads the same.
    bound = Bound(tmp_path)
    question = {"questions": [{"question": "Which?", "header": "", "options": [{"label": "a"}]}]}
    await bound.asks(PermissionAsked("r1", "AskUserQuestion", question, "tu1", "ask", ()))
    await bound.store.add_rule(
        NewRule(
            bound.key,
            scope=RuleScope.ROOM,
            effect=RuleEffect.DENY,
            rule="AskUserQuestion",
            session_id=None,
            created_by=bound.user,
            at=2.0,
        )
    )
    await bound.flow.apply_rules(bound.key)
    [answer] = bound.answers()
    assert answer == {
        "behavior": "deny",
        "message": "The user declined to answer: a rule of this room denies it (AskUserQuestion)",
    }

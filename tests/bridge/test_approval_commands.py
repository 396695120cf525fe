"""!approve, !deny, !model, !mode and !status against the memory store and fake live runs."""

from __future__ import annotations

import asyncio

import pytest

from bridge.core.model import (
    SessionId,
)
from bridge.core.transport import ApprovalChoice
from bridge.live.approval_desk import ApprovalDesk
from bridge.live.approvals import DEFAULT_DENIAL, Verdict
from bridge.store.base import (
    ApprovalState,
    AuditAction,
    AuditFilter,
    RoomOverrides,
)
from tests.bridge.approval_rooms import ALICE, BOB, CAROL, EVE, ROOM, RUN, make_room, start_run_of


async def test_approve_without_id_takes_the_oldest_waiting_request() -> None:
    room = make_room()
    await room.ask("r1")
    await room.ask("r2")
    answer = await room.say(BOB, "!approve")
    assert answer == "Request `#1` (`Bash`): allowed by `@bob:x`."
    assert room.live.decisions == [(1, ApprovalChoice.ALLOW, BOB, "")]
    assert [a.number for a in await room.store.pending_approvals(ROOM)] == [2]
    audit = (await room.store.audit_trail(AuditFilter(run_id=RUN)))[-1]
    assert (audit.action, audit.actor, audit.at) == (AuditAction.APPROVAL_ALLOWED, BOB, 1000.0)


async def test_approve_session_and_deny_with_a_reason_by_number() -> None:
    room = make_room()
    await room.ask("r1")
    await room.ask("r2")
    await room.say(BOB, "!deny #2 not on a Friday")
    await room.say(ALICE, "!approve session #1")
    assert room.live.decisions == [
        (2, ApprovalChoice.DENY, BOB, "The user denied this tool use: not on a Friday"),
        (1, ApprovalChoice.ALLOW_SESSION, ALICE, ""),
    ]
    first = await room.store.approval_by_number(ROOM, 1)
    second = await room.store.approval_by_number(ROOM, 2)
    assert first is not None
    assert first.state is ApprovalState.ALLOWED_SESSION
    assert second is not None
    assert (second.state, second.reason) == (
        ApprovalState.DENIED,
        "not on a Friday",
    )


async def test_deny_without_reason_tells_claude_the_default() -> None:
    room = make_room()
    await room.ask("r1")
    await room.say(BOB, "!deny")
    assert room.live.decisions == [(1, ApprovalChoice.DENY, BOB, DEFAULT_DENIAL)]


async def test_a_second_answer_is_told_the_first_and_reaches_no_run() -> None:
    room = make_room()
    await room.ask("r1")
    await room.say(BOB, "!approve #1")
    answer = await room.say(ALICE, "!deny #1")
    assert answer == "Already answered. Request `#1` (`Bash`): allowed by `@bob:x`."
    assert len(room.live.decisions) == 1


async def test_racing_answers_reach_the_run_once() -> None:
    room = make_room()
    await room.ask("r1")
    await asyncio.gather(room.say(BOB, "!approve #1"), room.say(ALICE, "!deny #1"))
    assert len(room.live.decisions) == 1


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("!approve", "No tool request is waiting."),
        ("!approve #9", "There is no request `#9` here."),
        ("!approve now", "Say `!approve #N`"),
    ],
)
async def test_nothing_to_answer(text: str, answer: str) -> None:
    room = make_room()
    assert (await room.say(BOB, text) or "").startswith(answer)
    assert room.live.decisions == []


async def test_an_allowed_user_who_is_not_an_approver_is_told_and_counted() -> None:
    room = make_room(approvers=[BOB])
    await room.ask("r1")
    answer = await room.say(ALICE, "!approve #1")
    assert answer is not None
    assert "not an approver" in answer
    assert room.refused == [Verdict.NOT_APPROVER]
    assert room.live.decisions == []
    assert len(await room.store.pending_approvals(ROOM)) == 1


async def test_a_stranger_hears_nothing_and_is_counted() -> None:
    room = make_room()
    await room.ask("r1")
    assert await room.say(EVE, "!approve #1") is None
    assert room.refused == [Verdict.STRANGER]
    assert room.live.decisions == []


async def test_approvers_star_means_anyone_allowed_in_the_room_not_anyone_at_all() -> None:
    # docs/configuration.md: `["*"]`: anyone allowed in the room. It let anyone in a
    # (public) room allow claude's tool uses, strangers the room otherwise ignores.
    room = make_room(approvers=["*"])
    await room.ask("r1")
    assert await room.say(EVE, "!approve #1") is None
    assert room.refused == [Verdict.STRANGER]
    assert room.live.decisions == []
    assert await room.say(CAROL, "!approve #1") == "Request `#1` (`Bash`): allowed by `@carol:x`."


async def test_require_other_approver_refuses_the_runs_own_senders() -> None:
    room = make_room(require_other_approver=True)
    await start_run_of(room, ALICE, CAROL)
    await room.ask("r1")
    answer = await room.say(ALICE, "!approve")
    assert answer is not None
    assert "another approver" in answer
    assert room.refused == [Verdict.OWN_RUN]
    assert await room.say(BOB, "!approve") == "Request `#1` (`Bash`): allowed by `@bob:x`."


async def test_expiry_denies_and_tells_claude_it_timed_out() -> None:
    room = make_room()
    await room.ask("r1")
    desk = ApprovalDesk(
        room.store, room.handler.rooms, room.live, room.refused.append, lambda: room.now[0]
    )
    assert await desk.expire_due() == []
    room.now[0] += 900
    [expired] = await desk.expire_due()
    assert (expired.state, expired.decided_by) == (ApprovalState.EXPIRED, None)
    [(number, choice, sender, told)] = room.live.decisions
    assert (number, choice, sender) == (1, ApprovalChoice.DENY, None)
    assert "timed out" in told
    assert await room.say(BOB, "!approve #1") == (
        "Already answered. Request `#1` (`Bash`): denied: nobody answered in time."
    )


async def test_model_and_mode_persist_for_the_next_runs() -> None:
    room = make_room()
    answer = await room.say(BOB, "!model opus")
    assert answer == "This room's runs use model `opus` from now on. The running run switched too."
    await room.say(BOB, "!mode acceptedits")
    assert await room.store.room_overrides(ROOM) == RoomOverrides("opus", "acceptEdits")
    assert room.live.models == [(ROOM, "opus")]
    assert room.live.modes == [(ROOM, "acceptEdits")]
    trail = await room.store.audit_trail(AuditFilter(room=ROOM))
    assert [a.detail for a in trail if a.action is AuditAction.ROOM_OVERRIDE_SET] == [
        "model=opus",
        "permission_mode=acceptEdits",
    ]


async def test_reset_goes_back_to_the_configured_model_and_mode() -> None:
    room = make_room()  # configured: model sonnet, no mode
    await room.say(BOB, "!model opus")
    await room.say(BOB, "!mode plan")
    answer = await room.say(BOB, "!model reset")
    assert answer == (
        "This room's runs use the configured model (`sonnet`) from now on."
        " The running run switched too."
    )
    answer = await room.say(BOB, "!mode RESET")
    assert answer is not None
    assert answer.startswith("This room's runs use the configured permission mode (`default`)")
    assert await room.store.room_overrides(ROOM) == RoomOverrides()
    # The running run goes back too: the configured model, claude's default mode.
    assert room.live.models[-1] == (ROOM, "sonnet")
    assert room.live.modes[-1] == (ROOM, "default")
    assert await room.say(BOB, "!model") == "Model: `sonnet`."


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("!model --dangerously-skip-permissions", "is not a model name"),
        ("!mode yolo", "is not a permission mode"),
        # Words after the first were dropped: `claude` became the model, every run failed.
        ("!model claude opus 4", "`claude opus 4` is not a model name"),
        ('!model "opus"', "is not a model name"),
        ("!mode plan please", "`plan please` is not a permission mode"),
        ("!model", "Model: `sonnet`."),
        ("!mode", "Mode: claude's default."),
    ],
)
async def test_model_and_mode_refuse_nonsense_and_show_the_current(text: str, answer: str) -> None:
    room = make_room()
    assert answer in (await room.say(BOB, text) or "")
    assert await room.store.room_overrides(ROOM) == RoomOverrides()


async def test_only_approvers_change_the_model() -> None:
    room = make_room(approvers=[BOB])
    answer = await room.say(ALICE, "!model opus")
    assert answer is not None
    assert "not an approver" in answer
    # It was told about changing the model, not about tool requests it never answered.
    assert "tool requests" not in answer
    assert "`!model`" in answer
    assert room.refused == [Verdict.NOT_APPROVER]
    assert await room.say(EVE, "!mode plan") is None
    assert await room.store.room_overrides(ROOM) == RoomOverrides()
    assert room.live.models == room.live.modes == []


async def test_status_shows_model_mode_and_waiting_requests() -> None:
    room = make_room()
    await room.say(BOB, "!mode plan")
    await room.ask("r1", tool="WebFetch")
    room.now[0] += 125
    status = await room.say(ALICE, "!status") or ""
    assert "Model: `sonnet`." in status
    assert "Mode: `plan` (set by command)." in status
    assert "- `#1` `WebFetch`, asked 2m05s ago" in status


async def test_without_live_runs_requests_cannot_be_answered() -> None:
    room = make_room()
    room.handler.live = None
    await room.ask("r1")
    assert "cannot be answered" in (await room.say(BOB, "!approve") or "")
    assert len(await room.store.pending_approvals(ROOM)) == 1


async def test_approve_edits_is_for_plans_and_never_keeps_a_rule_of_a_tool_use() -> None:
    # `edits` starts a plan with edits accepted; said of a tool request (a wrong number,
    # or the oldest request being a command) it once allowed it and kept a session rule.
    room = make_room(approvers=[BOB])
    await room.ask("r1")
    answer = await room.say(BOB, "!approve edits #1")
    assert answer is not None
    assert "plan" in answer
    assert room.live.decisions == []
    assert await room.store.active_rules(ROOM, SessionId("s-1")) == []
    answer = await room.say(BOB, "!approve edits")
    assert room.live.decisions == []
    approval = await room.store.approval_by_number(ROOM, 1)
    assert approval is not None
    assert approval.state is ApprovalState.PENDING


@pytest.mark.parametrize("tool", ["ExitPlanMode", "AskUserQuestion"])
async def test_feedback_on_a_plan_too_long_to_keep_is_refused_never_cut(tool: str) -> None:
    # claude reads a plan's feedback as the person's instructions: cut, it would read
    # less than they wrote (and not know it).
    room = make_room(approvers=[BOB])
    await room.ask("r1", tool)
    feedback = "keep the data; " * 40 + "and never drop the production database"
    answer = await room.say(BOB, f"!deny #1 {feedback}")
    assert answer is not None
    assert "shorter" in answer
    assert room.live.decisions == []
    await room.say(BOB, "!deny #1 keep the data")
    assert [d[3] for d in room.live.decisions] == [
        "The user wants you to keep planning: keep the data"
        if tool == "ExitPlanMode"
        else "The user declined to answer: keep the data"
    ]


async def test_the_runs_sender_may_decline_a_question_by_command_as_by_button() -> None:
    # A question is its run's senders' to answer (questions_from's default): `!deny`
    # declines it for them as the Deny button does, and stays an approver's for a tool.
    room = make_room(approvers=[BOB])
    await start_run_of(room, ALICE)
    await room.ask("r1", "AskUserQuestion")
    await room.ask("r2")
    answer = await room.say(ALICE, "!deny #1 not now")
    assert answer == "Question `#1`: declined by `@alice:x`."
    assert room.live.decisions == [
        (1, ApprovalChoice.DENY, ALICE, "The user declined to answer: not now")
    ]
    refused = await room.say(ALICE, "!deny #2")
    assert refused is not None
    assert "not an approver" in refused
    assert len(room.live.decisions) == 1

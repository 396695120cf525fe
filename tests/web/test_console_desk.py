"""Answering a request from the console goes through the chat's ApprovalDesk with the
same rules (bridge/web/actions.py, docs/web.md "The pages")."""

from __future__ import annotations

from bridge.core.transport import ApprovalChoice
from bridge.live.approval_desk import ApprovalDesk
from bridge.store.base import ApprovalState
from bridge.web.actions import DeskActions
from tests.bridge.approval_rooms import ALICE, BOB, ROOM, Room, make_room, start_run_of


def desk_actions(room: Room) -> DeskActions:
    desk = ApprovalDesk(
        room.store, room.handler.rooms, room.live, room.refused.append, lambda: room.now[0]
    )
    return DeskActions(room.store, desk, room.handler.rooms)


async def test_a_person_whose_other_chat_id_sent_the_run_may_not_approve_it() -> None:
    # One web identity is one person: with require_other_approver, the run's sender may not
    # approve it through another of their chat ids that happens to be an approver.
    room = make_room(require_other_approver=True)
    await start_run_of(room, ALICE)
    approval = await room.ask("r1")
    told = await desk_actions(room).answer((ALICE, BOB), approval.id, ApprovalChoice.ALLOW, "")
    assert "another approver" in told
    assert room.live.decisions == []
    [still] = await room.store.pending_approvals(ROOM)
    assert still.state is ApprovalState.PENDING


async def test_another_approver_answers_from_the_console() -> None:
    room = make_room(require_other_approver=True)
    await start_run_of(room, ALICE)
    approval = await room.ask("r1")
    told = await desk_actions(room).answer((BOB,), approval.id, ApprovalChoice.ALLOW, "")
    assert "allowed by" in told
    assert room.live.decisions == [(1, ApprovalChoice.ALLOW, BOB, "")]

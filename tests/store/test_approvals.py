"""The approvals part of the Store contract, against every backend."""

from __future__ import annotations

import asyncio

import pytest

from bridge.core.model import (
    ExternalMessageId,
    RoomId,
    RoomKey,
    RunId,
    SessionId,
    TransportName,
    UserId,
)
from bridge.store.base import (
    ApprovalDecision,
    ApprovalState,
    AuditAction,
    AuditFilter,
    RoomOverrides,
)
from tests.store.approval_rows import ROOM, RUN, ask
from tests.store.conftest import InspectableStore

OTHER_ROOM = RoomKey(TransportName("slack"), RoomId("!a:localhost"))  # same id, other transport
ALICE = UserId("@alice:localhost")
BOB = UserId("@bob:localhost")


async def test_a_request_is_pending_under_the_rooms_next_number(store: InspectableStore) -> None:
    first = await ask(store, "r1")
    second = await ask(store, "r2", asked_at=101.0)
    elsewhere = await ask(store, "r3", room=OTHER_ROOM)

    assert (first.number, second.number, elsewhere.number) == (1, 2, 1)
    assert first.state is ApprovalState.PENDING
    assert (first.room, first.run_id, first.request_id, first.tool_name) == (
        ROOM,
        RUN,
        "r1",
        "Bash",
    )
    assert (first.input_json, first.asked_at, first.expires_at) == ('{"command": "ls"}', 100, 1000)
    assert (first.message_id, first.decided_by, first.decided_at, first.reason) == (
        None,
        None,
        None,
        "",
    )
    assert await store.pending_approvals(ROOM) == [first, second]
    assert await store.pending_approvals() == [first, second, elsewhere]
    assert await store.approval_by_number(ROOM, 2) == second
    assert await store.approval_by_number(OTHER_ROOM, 2) is None
    assert await store.approval_by_number(ROOM, 2**40) is None
    trail = await store.audit_trail(AuditFilter(room=ROOM))
    assert [(a.action, a.run_id, a.detail) for a in trail] == [
        (AuditAction.APPROVAL_ASKED, RUN, "#1 Bash pending"),
        (AuditAction.APPROVAL_ASKED, RUN, "#2 Bash pending"),
    ]


async def test_a_replayed_request_is_the_same_approval(store: InspectableStore) -> None:
    first = await ask(store, "r1")
    await store.decide_approval(first, ApprovalDecision(ApprovalState.DENIED, ALICE, 150.0, "no"))
    replayed = await ask(store, "r1", asked_at=300.0, expires_at=900.0)
    assert replayed.id == first.id
    assert (replayed.number, replayed.state, replayed.asked_at) == (1, ApprovalState.DENIED, 100)
    # The same request id in another run is another request.
    other = await ask(store, "r1", run_id=RunId("run-2"))
    assert other.number == 2
    trail = await store.audit_trail(AuditFilter(room=ROOM))
    assert sum(a.action is AuditAction.APPROVAL_ASKED for a in trail) == 2


async def test_concurrent_requests_get_distinct_numbers(store: InspectableStore) -> None:
    made = await asyncio.gather(*(ask(store, f"r{i}") for i in range(8)))
    assert sorted(a.number for a in made) == list(range(1, 9))


async def test_numbers_are_never_reused_after_pruning(store: InspectableStore) -> None:
    first = await ask(store, "r1")
    assert await store.decide_approval(first, ApprovalDecision(ApprovalState.ALLOWED, ALICE, 110.0))
    assert await store.prune(older_than=200.0) >= 1
    assert await store.approval_by_number(ROOM, 1) is None
    assert (await ask(store, "r2", asked_at=300.0)).number == 2


async def test_pruning_keeps_pending_and_recent_requests(store: InspectableStore) -> None:
    old_pending = await ask(store, "r1", asked_at=10.0)
    recent = await ask(store, "r2", asked_at=10.0)
    await store.decide_approval(recent, ApprovalDecision(ApprovalState.DENIED, ALICE, 500.0))
    await store.prune(older_than=200.0)
    assert await store.pending_approvals() == [old_pending]
    assert await store.approval_by_number(ROOM, 2) is not None


async def test_the_request_message_finds_its_approval(store: InspectableStore) -> None:
    approval = await ask(store, "r1")
    await store.set_approval_message(approval, ExternalMessageId("$ask1"))
    found = await store.approval_by_message(ROOM, ExternalMessageId("$ask1"))
    assert found is not None
    assert (found.id, found.message_id) == (approval.id, "$ask1")
    assert await store.approval_by_message(OTHER_ROOM, ExternalMessageId("$ask1")) is None
    assert await store.approval_by_message(ROOM, ExternalMessageId("$other")) is None


@pytest.mark.parametrize(
    ("state", "action"),
    [
        (ApprovalState.ALLOWED, AuditAction.APPROVAL_ALLOWED),
        (ApprovalState.ALLOWED_SESSION, AuditAction.APPROVAL_ALLOWED),
        (ApprovalState.DENIED, AuditAction.APPROVAL_DENIED),
    ],
)
async def test_a_decision_is_recorded_once_and_audited(
    store: InspectableStore, state: ApprovalState, action: AuditAction
) -> None:
    approval = await ask(store, "r1")
    assert await store.decide_approval(approval, ApprovalDecision(state, BOB, 120.0, "why"))
    assert not await store.decide_approval(
        approval, ApprovalDecision(ApprovalState.DENIED, ALICE, 121.0, "late")
    )

    decided = await store.approval_by_number(ROOM, 1)
    assert decided is not None
    assert (decided.state, decided.decided_by, decided.decided_at, decided.reason) == (
        state,
        BOB,
        120.0,
        "why",
    )
    assert await store.pending_approvals() == []
    last = (await store.audit_trail(AuditFilter(run_id=RUN)))[-1]
    assert (last.action, last.actor, last.at, last.room) == (action, BOB, 120.0, ROOM)
    assert last.detail == f"#1 Bash {state.value}: why"


async def test_racing_approvers_decide_once(store: InspectableStore) -> None:
    approval = await ask(store, "r1")
    outcomes = await asyncio.gather(
        store.decide_approval(approval, ApprovalDecision(ApprovalState.ALLOWED, ALICE, 120.0)),
        store.decide_approval(approval, ApprovalDecision(ApprovalState.DENIED, BOB, 120.0)),
        store.decide_approval(
            approval, ApprovalDecision(ApprovalState.ALLOWED_SESSION, BOB, 120.0)
        ),
    )
    assert sorted(outcomes) == [False, False, True]
    decisions = [
        a
        for a in await store.audit_trail(AuditFilter(run_id=RUN))
        if a.action is not AuditAction.APPROVAL_ASKED
    ]
    assert len(decisions) == 1


async def test_expiry_is_a_decision_nobody_made(store: InspectableStore) -> None:
    early = await ask(store, "r1", expires_at=150.0)
    await ask(store, "r2", expires_at=300.0)
    late = await ask(store, "r3", expires_at=150.0)
    assert await store.expired_approvals(149.0) == []
    due = await store.expired_approvals(150.0)
    assert [a.id for a in due] == [early.id, late.id]
    assert await store.decide_approval(
        early, ApprovalDecision(ApprovalState.EXPIRED, None, 150.0, "timed out")
    )
    assert [a.id for a in await store.expired_approvals(200.0)] == [late.id]
    last = (await store.audit_trail(AuditFilter(run_id=RUN)))[-1]
    assert (last.action, last.actor) == (AuditAction.APPROVAL_EXPIRED, None)


async def test_decide_refuses_pending_as_a_decision(store: InspectableStore) -> None:
    approval = await ask(store, "r1")
    with pytest.raises(ValueError, match="cannot be decided"):
        await store.decide_approval(approval, ApprovalDecision(ApprovalState.PENDING, ALICE, 120.0))
    assert await store.pending_approvals() == [approval]


async def test_one_request_can_be_cancelled_alone(store: InspectableStore) -> None:
    """claude withdrew it (an interrupt): the run's other requests still wait."""
    first, second = await ask(store, "r1"), await ask(store, "r2")
    assert await store.decide_approval(
        first, ApprovalDecision(ApprovalState.CANCELLED, None, 120.0, "claude withdrew it")
    )
    assert await store.pending_approvals() == [second]
    last = (await store.audit_trail(AuditFilter(run_id=RUN)))[-1]
    assert last.action is AuditAction.APPROVAL_CANCELLED


async def test_a_runs_end_cancels_its_pending_requests(store: InspectableStore) -> None:
    decided = await ask(store, "r1")
    await store.decide_approval(decided, ApprovalDecision(ApprovalState.ALLOWED, ALICE, 110.0))
    waiting = await ask(store, "r2")
    other_run = await ask(store, "r3", run_id=RunId("run-2"))

    cancelled = await store.cancel_approvals(RUN, "the run ended", 130.0)
    assert [(a.id, a.state, a.decided_at, a.reason) for a in cancelled] == [
        (waiting.id, ApprovalState.CANCELLED, 130.0, "the run ended")
    ]
    assert await store.pending_approvals() == [other_run]
    assert not await store.decide_approval(
        waiting, ApprovalDecision(ApprovalState.ALLOWED, ALICE, 140.0)
    )
    assert await store.cancel_approvals(RUN, "again", 150.0) == []
    last = (await store.audit_trail(AuditFilter(run_id=RUN)))[-1]
    assert (last.action, last.detail) == (
        AuditAction.APPROVAL_CANCELLED,
        "#2 Bash cancelled: the run ended",
    )


async def test_a_withdrawn_request_alone_is_cancelled(store: InspectableStore) -> None:
    first = await ask(store, "r1")
    second = await ask(store, "r2")
    cancelled = await store.cancel_approvals(RUN, "withdrawn", 130.0, ("r1",))
    assert [(a.id, a.state) for a in cancelled] == [(first.id, ApprovalState.CANCELLED)]
    assert await store.pending_approvals() == [second]
    assert await store.cancel_approvals(RUN, "withdrawn", 140.0, ("r1",)) == []


async def test_room_overrides_persist_apart_from_the_session(store: InspectableStore) -> None:
    assert await store.room_overrides(ROOM) == RoomOverrides()
    await store.set_room_model(ROOM, "opus")
    await store.set_session(ROOM, SessionId("s1"))
    await store.set_room_mode(ROOM, "plan")
    assert await store.room_overrides(ROOM) == RoomOverrides("opus", "plan")
    await store.set_session(ROOM, None)  # !reset keeps the overrides
    assert await store.room_overrides(ROOM) == RoomOverrides("opus", "plan")
    assert await store.get_session(ROOM) is None
    await store.set_room_model(ROOM, None)
    assert await store.room_overrides(ROOM) == RoomOverrides(None, "plan")
    assert await store.room_overrides(OTHER_ROOM) == RoomOverrides()


async def test_the_approval_counter_survives_a_session_reset(store: InspectableStore) -> None:
    await ask(store, "r1")
    await store.set_session(ROOM, SessionId("s1"))
    await store.set_room_model(ROOM, "opus")
    assert (await ask(store, "r2")).number == 2
    assert await store.get_session(ROOM) == "s1"


async def test_a_withdrawn_request_is_cancelled_alone(store: InspectableStore) -> None:
    withdrawn = await ask(store, "r1")
    waiting = await ask(store, "r2")
    cancelled = await store.cancel_approvals(RUN, "claude withdrew it", 130.0, ("r1",))
    assert [(a.id, a.state, a.reason) for a in cancelled] == [
        (withdrawn.id, ApprovalState.CANCELLED, "claude withdrew it")
    ]
    assert await store.pending_approvals() == [waiting]
    assert await store.cancel_approvals(RUN, "again", 140.0, ("r1", "unknown")) == []


async def test_a_request_keeps_the_digest_of_what_was_shown(store: InspectableStore) -> None:
    asked = await ask(store, "r1", shown_digest="ab" * 32)
    assert asked.shown_digest == "ab" * 32
    found = await store.approval_by_number(ROOM, asked.number)
    assert found is not None
    assert found.shown_digest == "ab" * 32
    # A replay finds the first record, with the digest of what was shown then.
    again = await ask(store, "r1", asked_at=200.0, shown_digest="cd" * 32)
    assert again.shown_digest == "ab" * 32

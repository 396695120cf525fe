"""The tool rules part of the Store contract, against every backend."""

from __future__ import annotations

import asyncio

import pytest

from bridge.core.model import RoomId, RoomKey, SessionId, TransportName, UserId
from bridge.store.base import (
    ApprovalDecision,
    ApprovalState,
    AuditAction,
    AuditFilter,
    NewRule,
    RuleEffect,
    RuleScope,
    ToolRule,
)
from tests.store.approval_rows import ask
from tests.store.conftest import InspectableStore

ROOM = RoomKey(TransportName("slack"), RoomId("C1"))
THREAD = ROOM.in_thread("1700000000.000100")
OTHER_ROOM = RoomKey(TransportName("matrix"), RoomId("C1"))  # same id, other transport
ALICE = UserId("alice")
BOB = UserId("bob")
S1 = SessionId("s-1")
S2 = SessionId("s-2")


async def keep(
    store: InspectableStore,
    rule: str,
    *,
    room: RoomKey = ROOM,
    session: SessionId | None = None,
    effect: RuleEffect = RuleEffect.ALLOW,
    at: float = 100.0,
) -> ToolRule:
    scope = RuleScope.ROOM if session is None else RuleScope.SESSION
    return await store.add_rule(
        NewRule(
            room, scope=scope, effect=effect, rule=rule, session_id=session, created_by=ALICE, at=at
        )
    )


async def test_a_session_rule_holds_only_in_its_session(store: InspectableStore) -> None:
    kept = await keep(store, "Bash(rm -rf build)", session=S1)

    assert (kept.room, kept.scope, kept.session_id, kept.effect, kept.rule) == (
        ROOM,
        RuleScope.SESSION,
        S1,
        RuleEffect.ALLOW,
        "Bash(rm -rf build)",
    )
    assert (kept.created_by, kept.created_at, kept.revoked_by, kept.revoked_at) == (
        ALICE,
        100.0,
        None,
        None,
    )
    assert await store.active_rules(ROOM, S1) == [kept]
    assert await store.active_rules(ROOM, S2) == []
    assert await store.active_rules(ROOM, None) == []
    assert await store.active_rules(OTHER_ROOM, S1) == []


async def test_room_rules_hold_in_every_session_and_thread_of_the_room(
    store: InspectableStore,
) -> None:
    allow = await keep(store, "Bash(npm test:*)", room=THREAD)
    deny = await keep(store, "Bash(rm:*)", effect=RuleEffect.DENY, at=101.0)
    session = await keep(store, "Write(/tmp/x)", room=THREAD, session=S1, at=102.0)

    assert allow.room == ROOM  # a thread's rule is its room's
    assert await store.active_rules(ROOM, None) == [allow, deny]
    assert await store.active_rules(THREAD, S2) == [allow, deny]
    assert await store.active_rules(ROOM.in_thread("other"), S1) == [allow, deny, session]


async def test_a_revoked_rule_holds_no_more_and_is_revoked_once(store: InspectableStore) -> None:
    kept = await keep(store, "Bash(npm test:*)")
    other = await keep(store, "Read", at=101.0)

    assert await store.revoke_rule(OTHER_ROOM, kept.id, BOB, 110.0) is None
    revoked = await store.revoke_rule(THREAD, kept.id, BOB, 110.0)

    assert revoked is not None
    assert (revoked.id, revoked.revoked_by, revoked.revoked_at) == (kept.id, BOB, 110.0)
    assert await store.revoke_rule(ROOM, kept.id, ALICE, 120.0) is None
    assert await store.revoke_rule(ROOM, 2**40, ALICE, 120.0) is None
    assert await store.active_rules(ROOM, None) == [other]


async def test_every_change_of_a_rule_is_audited(store: InspectableStore) -> None:
    kept = await keep(store, "Bash(npm test:*)", session=S1)
    await store.revoke_rule(ROOM, kept.id, BOB, 110.0)

    trail = await store.audit_trail(AuditFilter(room=ROOM))
    assert [(a.action, a.actor, a.at, a.detail) for a in trail] == [
        (AuditAction.RULE_ADDED, ALICE, 100.0, f"rule {kept.id} session allow Bash(npm test:*)"),
        (AuditAction.RULE_REVOKED, BOB, 110.0, f"rule {kept.id} session allow Bash(npm test:*)"),
    ]


async def test_rule_numbers_are_never_reused(store: InspectableStore) -> None:
    first = await keep(store, "Read")
    await store.revoke_rule(ROOM, first.id, BOB, 110.0)
    second = await keep(store, "Read", at=120.0)
    assert second.id > first.id


async def test_a_session_rule_without_its_session_is_refused(store: InspectableStore) -> None:
    with pytest.raises(ValueError, match="session"):
        await store.add_rule(
            NewRule(
                ROOM,
                scope=RuleScope.SESSION,
                effect=RuleEffect.ALLOW,
                rule="Read",
                session_id=None,
                created_by=ALICE,
                at=1.0,
            )
        )


async def test_of_two_revokes_at_once_one_revokes_and_one_row_is_audited(
    store: InspectableStore,
) -> None:
    kept = await keep(store, "Bash(npm test:*)")
    first, second = await asyncio.gather(
        store.revoke_rule(ROOM, kept.id, ALICE, 110.0),
        store.revoke_rule(ROOM, kept.id, BOB, 111.0),
    )
    assert [r is not None for r in (first, second)].count(True) == 1
    trail = await store.audit_trail(AuditFilter(room=ROOM))
    assert [a.action for a in trail].count(AuditAction.RULE_REVOKED) == 1


async def test_a_rule_decides_a_request_only_while_it_holds(store: InspectableStore) -> None:
    # A revoke landing between reading the rules and deciding: "asked again" holds.
    kept = await keep(store, "Bash(ls)")
    first = await ask(store, "r1", room=ROOM)
    second = await ask(store, "r2", room=ROOM)
    assert await store.decide_approval(
        first, ApprovalDecision(ApprovalState.ALLOWED, None, 101.0, "by rule", rule_id=kept.id)
    )
    await store.revoke_rule(ROOM, kept.id, BOB, 102.0)
    assert not await store.decide_approval(
        second, ApprovalDecision(ApprovalState.ALLOWED, None, 103.0, "by rule", rule_id=kept.id)
    )
    found = await store.approval_by_number(ROOM, second.number)
    assert found is not None
    assert found.state is ApprovalState.PENDING

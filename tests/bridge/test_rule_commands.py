"""Rules kept by answers and by ``!rules``: who may, what is kept, what is said, what is
audited (commands against the memory store; the live run is a fake)."""

from __future__ import annotations

import json

from bridge.core.model import RunId, SessionId
from bridge.core.transport import ApprovalChoice
from bridge.store.base import ApprovalAsk, AuditAction, AuditFilter, RuleEffect, RuleScope
from tests.bridge.approval_rooms import ALICE, BOB, ROOM, make_room


async def test_approve_session_keeps_an_allow_rule_of_the_runs_session() -> None:
    room = make_room()
    await room.ask("r1")
    answer = await room.say(BOB, "!approve session #1")
    assert answer == (
        "Request `#1` (`Bash`): allowed for the session by `@bob:x`."
        " Kept rule 1: allow `Bash(make deploy)` in this session."
    )
    # claude is told "allow", nothing else (the fake records the choice only); the
    # room's other waiting requests are then checked against the new rule.
    assert room.live.decisions == [(1, ApprovalChoice.ALLOW_SESSION, BOB, "")]
    assert room.live.rules_applied == [ROOM]
    [rule] = await room.store.active_rules(ROOM, SessionId("s-1"))
    assert (rule.scope, rule.session_id, rule.effect, rule.rule, rule.created_by) == (
        RuleScope.SESSION,
        "s-1",
        RuleEffect.ALLOW,
        "Bash(make deploy)",
        BOB,
    )
    assert await room.store.active_rules(ROOM, SessionId("s-2")) == []


async def test_approve_session_without_a_known_session_keeps_no_rule() -> None:
    room = make_room()
    room.live.session = None
    await room.ask("r1")
    answer = await room.say(BOB, "!approve session #1")
    assert answer is not None
    assert "No rule was kept" in answer
    assert room.live.decisions == [(1, ApprovalChoice.ALLOW_SESSION, BOB, "")]
    assert room.live.rules_applied == []
    assert await room.store.active_rules(ROOM, None) == []


async def test_always_keeps_room_rules_that_hold_in_every_session() -> None:
    room = make_room()
    await room.ask("r1")
    await room.ask("r2")
    allowed = await room.say(BOB, "!approve always #1")
    denied = await room.say(ALICE, "!deny always #2 never from chat")
    assert allowed is not None
    assert "Kept rule 1: allow `Bash(make deploy)` in this room." in allowed
    assert denied is not None
    assert denied.startswith("Request `#2` (`Bash`): denied by `@alice:x` (`never from chat`).")
    assert "Kept rule 2: deny `Bash(make deploy)` in this room." in denied
    assert room.live.decisions == [
        (1, ApprovalChoice.ALLOW, BOB, ""),
        (2, ApprovalChoice.DENY, ALICE, "The user denied this tool use: never from chat"),
    ]
    rules = await room.store.active_rules(ROOM, None)
    assert [(r.id, r.scope, r.effect) for r in rules] == [
        (1, RuleScope.ROOM, RuleEffect.ALLOW),
        (2, RuleScope.ROOM, RuleEffect.DENY),
    ]


async def test_rules_lists_revokes_and_keeps_rules_audited() -> None:
    room = make_room(approvers=[BOB])
    assert (await room.say(ALICE, "!rules") or "").startswith("No tool rules hold here")
    kept = await room.say(BOB, "!rules allow Bash(npm test:*)")
    assert kept == (
        "Kept rule `1`: allow `Bash(npm test:*)` in this room, in every session,"
        " until `!rules revoke 1`."
    )
    await room.ask("r1")
    await room.say(BOB, "!approve session #1")
    room.now[0] += 120
    listed = await room.say(ALICE, "!rules")
    assert listed == "\n".join(
        [
            "Rules of this room (`!rules revoke N` ends one; deny rules win):",
            "- `1` allow `Bash(npm test:*)` in this room, by `@bob:x` 2m00s ago",
            "- `2` allow `Bash(make deploy)` in this session, by `@bob:x` 2m00s ago",
        ]
    )
    refused = await room.say(ALICE, "!rules revoke 1")
    assert refused is not None
    assert "not an approver" in refused
    assert await room.say(BOB, "!rules revoke #1") == (
        "Rule `1` (allow `Bash(npm test:*)`) is revoked: such requests are asked again."
    )
    assert await room.say(BOB, "!rules revoke 1") == "No rule `1` holds in this room."
    assert [r.id for r in await room.store.active_rules(ROOM, SessionId("s-1"))] == [2]
    trail = [
        (a.action, a.actor, a.detail)
        for a in await room.store.audit_trail(AuditFilter(room=ROOM))
        if a.action in (AuditAction.RULE_ADDED, AuditAction.RULE_REVOKED)
    ]
    assert trail == [
        (AuditAction.RULE_ADDED, BOB, "rule 1 room allow Bash(npm test:*)"),
        (AuditAction.RULE_ADDED, BOB, "rule 2 session allow Bash(make deploy)"),
        (AuditAction.RULE_REVOKED, BOB, "rule 1 room allow Bash(npm test:*)"),
    ]


async def test_only_approvers_keep_rules_and_only_rules_are_kept() -> None:
    room = make_room(approvers=[BOB])
    refused = await room.say(ALICE, "!rules deny Bash")
    assert refused is not None
    assert "not an approver" in refused
    not_a_rule = await room.say(BOB, "!rules deny Bash(")
    assert not_a_rule is not None
    assert not_a_rule.startswith("`Bash(` is not a rule.")
    assert (await room.say(BOB, "!rules forget 1") or "").startswith("Say `!rules`")
    assert await room.store.active_rules(ROOM, None) == []


async def test_a_use_too_long_for_a_rule_is_allowed_once_and_no_rule_is_kept() -> None:
    room = make_room()
    await room.store.add_approval(
        ApprovalAsk(
            ROOM,
            RunId("run-1"),
            "r1",
            tool_name="Bash",
            input_json=json.dumps({"command": "echo " + "x" * 5000}),
            asked_at=room.now[0],
            expires_at=room.now[0] + 900,
        )
    )
    answer = await room.say(BOB, "!approve session #1")
    assert answer is not None
    assert answer.endswith("No rule was kept: the use is too long to keep as a rule.")
    assert room.live.decisions == [(1, ApprovalChoice.ALLOW_SESSION, BOB, "")]
    too_long = await room.say(BOB, "!rules allow Bash(" + "x" * 5000 + ")")
    assert too_long is not None
    assert "is not a rule" in too_long
    assert await room.store.active_rules(ROOM, SessionId("s-1")) == []


async def test_a_rule_that_could_never_match_is_refused_not_kept() -> None:
    # The room would read "Kept rule 1: deny `bash`" and believe Bash denied.
    room = make_room(approvers=[BOB])
    for rule in (
        "bash",
        "webfetch(domain:evil.com)",
        "WebFetch(https://evil.com)",
        "Edit(src/**)",
        "Read(.env)",
        "mcp__db__query(DROP:*)",
        "WebSearch(cats)",
        "WebFetch(domain:*.evil.com)",
    ):
        refused = await room.say(BOB, f"!rules deny {rule}")
        assert refused is not None
        assert "could never" in refused, rule
    assert await room.store.active_rules(ROOM, None) == []
    for rule in ("Edit(/srv/app/**)", "Read(**/.env)", "WebFetch(domain:x.org)", "mcp__db__query"):
        kept = await room.say(BOB, f"!rules deny {rule}")
        assert kept is not None
        assert kept.startswith("Kept rule"), rule


async def test_a_deny_rule_kept_says_it_stops_only_what_claude_asks() -> None:
    # claude reads its directory, runs `cat` and (acceptEdits) edits without asking: a deny
    # rule never sees those, and the room must not believe it stops them.
    room = make_room(approvers=[BOB])
    await room.ask("r1")
    for said in (
        await room.say(BOB, "!rules deny Read(/srv/app/.env)"),
        await room.say(BOB, "!deny always #1"),
    ):
        assert said is not None
        assert "only what claude asks for" in said
    allowed = await room.say(BOB, "!rules allow Bash(npm test:*)")
    assert allowed is not None
    assert "only what claude asks for" not in allowed


async def test_an_allow_rule_for_questions_or_plans_is_refused_a_deny_rule_kept() -> None:
    # No allow rule answers a question or approves a plan (a person does): kept, the
    # room would believe claude's plans approved by it.
    room = make_room(approvers=[BOB])
    for tool in ("AskUserQuestion", "ExitPlanMode"):
        refused = await room.say(BOB, f"!rules allow {tool}")
        assert refused is not None
        assert "could never" in refused, tool
    assert await room.store.active_rules(ROOM, None) == []
    kept = await room.say(BOB, "!rules deny AskUserQuestion")
    assert kept is not None
    assert kept.startswith("Kept rule")

"""``!rules``: the tool rules that hold in a conversation, listed, revoked, kept by hand.

A rule is chatbridge's own (:mod:`bridge.live.tool_rules`, docs/live-runs.md):
listing is for anyone allowed in the room; revoking one and keeping one
(``!rules allow RULE``, ``!rules deny RULE``: room rules) are for approvers.
Every change is an audit row (the store writes it with the change).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bridge.core.duration import format_duration
from bridge.core.model import Message
from bridge.live.approval_text import code_span
from bridge.live.controls import LiveControls
from bridge.live.questions import INTERACTIVE
from bridge.live.tool_rules import DENY_REACH, keepable, parse_rule, unmatchable
from bridge.store.base import NewRule, RuleEffect, RuleScope, RuleStore, ToolRule

_ID = re.compile(r"#?([0-9]{1,12})")
REVOKE_WORD = "revoke"


@dataclass(slots=True)
class RuleCommands:
    store: RuleStore
    prefix: str
    answer: Callable[[Message, str], Awaitable[None]]
    approver: Callable[[Message], Awaitable[bool]]
    """Whether the sender may change rules; tells them why not if not."""
    live: LiveControls | None
    wall_clock: Callable[[], float] = time.time

    async def handle(self, message: Message, rest: str) -> None:
        word, _, argument = rest.strip().partition(" ")
        word = word.lower()
        argument = argument.strip()
        if not word:
            await self._list(message)
        elif word == REVOKE_WORD:
            await self._revoke(message, argument)
        elif word in (RuleEffect.ALLOW, RuleEffect.DENY):
            await self._keep(message, RuleEffect(word), argument)
        else:
            await self.answer(message, self._usage())

    def _usage(self) -> str:
        p = self.prefix
        return (
            f"Say `{p}rules`, `{p}rules revoke N`, `{p}rules allow RULE` or"
            f" `{p}rules deny RULE` (a rule: `Bash(npm test:*)`, `Edit(/srv/app/**)`, `WebFetch`)."
        )

    async def _list(self, message: Message) -> None:
        session = await self.live.room_session(message.room) if self.live else None
        rules = await self.store.active_rules(message.room, session)
        if not rules:
            await self.answer(
                message,
                "No tool rules hold here: every tool request is asked"
                f" (`{self.prefix}approve session`, `{self.prefix}approve always`,"
                f" `{self.prefix}rules allow RULE` keep one).",
            )
            return
        now = self.wall_clock()
        lines = [f"Rules of this room (`{self.prefix}rules revoke N` ends one; deny rules win):"]
        lines += [rule_line(rule, now) for rule in rules]
        await self.answer(message, "\n".join(lines))

    async def _revoke(self, message: Message, argument: str) -> None:
        if not await self.approver(message):
            return
        match = _ID.fullmatch(argument)
        if match is None:
            await self.answer(message, self._usage())
            return
        revoked = await self.store.revoke_rule(
            message.room, int(match[1]), message.sender, self.wall_clock()
        )
        if revoked is None:
            await self.answer(message, f"No rule `{match[1]}` holds in this room.")
            return
        await self.answer(
            message,
            f"Rule `{revoked.id}` ({revoked.effect.value} {code_span(revoked.rule)}) is revoked:"
            " such requests are asked again.",
        )

    async def _keep(self, message: Message, effect: RuleEffect, argument: str) -> None:
        if not await self.approver(message):
            return
        rule = parse_rule(argument)
        if rule is None or not keepable(rule):
            await self.answer(message, f"{code_span(argument)} is not a rule. {self._usage()}")
            return
        why = unmatchable(rule)
        if why is None and effect is RuleEffect.ALLOW and rule.tool in INTERACTIVE:
            why = "a person answers claude's questions and plans, never an allow rule"
        if why is not None:
            await self.answer(
                message, f"{code_span(argument)} could never match a request: {why}. Not kept."
            )
            return
        kept = await self.store.add_rule(
            NewRule(
                message.room,
                scope=RuleScope.ROOM,
                effect=effect,
                rule=str(rule),
                session_id=None,
                created_by=message.sender,
                at=self.wall_clock(),
            )
        )
        if self.live is not None:
            await self.live.apply_rules(message.room)
        said = (
            f"Kept rule `{kept.id}`: {effect.value} {code_span(kept.rule)} in this room,"
            f" in every session, until `{self.prefix}rules revoke {kept.id}`."
        )
        await self.answer(message, f"{said} {DENY_REACH}" if effect is RuleEffect.DENY else said)


def rule_line(rule: ToolRule, now: float) -> str:
    """``- `3` allow `Bash(npm test:*)` in this room, by `alice` 2h ago``."""
    where = "in this session" if rule.scope is RuleScope.SESSION else "in this room"
    age = format_duration(max(0.0, now - rule.created_at))
    return (
        f"- `{rule.id}` {rule.effect.value} {code_span(rule.rule)} {where},"
        f" by {code_span(rule.created_by, 100)} {age} ago"
    )

"""Answering tool-use requests: one path for commands, buttons, reactions and expiry.

Each answer is judged (:mod:`bridge.live.approvals`), recorded by the store's
compare-and-set, and only then handed to the run: of two approvers
answering at once, exactly one reaches claude. An answer for the session
(``!approve session``, the button, the reaction) or for the room
(``!approve always``, ``!deny always``) also keeps a rule of chatbridge's own
(:mod:`bridge.live.tool_rules`): claude is still told only "allow this input".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from bridge.config import RoomSettings
from bridge.core.model import RoomKey, UserId
from bridge.core.transport import ApprovalChoice
from bridge.live.approval_text import code_span, parse_input
from bridge.live.approvals import Verdict, judge, judge_answer, refusal, state_of, timeout_message
from bridge.live.controls import LiveControls
from bridge.live.questions import ASK, INTERACTIVE, deny_text, outcome, unanswerable
from bridge.live.tool_rules import DENY_REACH, keepable, rule_for
from bridge.store.base import (
    Approval,
    ApprovalDecision,
    ApprovalState,
    ApprovalStore,
    MessageStore,
    NewRule,
    RuleEffect,
    RuleScope,
    RuleStore,
    RunStore,
    StoreError,
    ToolRule,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Answered:
    """What became of an answer: ``text`` for the person (None: say nothing), and
    whether it ``decided`` the request (if not, nothing shows it but ``text``)."""

    text: str | None
    decided: bool


class DeskStore(MessageStore, RunStore, ApprovalStore, RuleStore, Protocol):
    """The store's roles :class:`ApprovalDesk` uses."""


@dataclass(slots=True)
class ApprovalDesk:
    store: DeskStore
    rooms: Callable[[RoomKey], RoomSettings | None]
    live: LiveControls
    refused: Callable[[Verdict], None]
    """Counts an answer that was not taken (the metrics)."""
    wall_clock: Callable[[], float] = time.time
    owns: Callable[[RoomKey], bool] = lambda room: True
    """Expires only the requests of conversations this process runs (replicas)."""

    async def take(
        self,
        sender: UserId,
        approval: Approval,
        choice: ApprovalChoice,
        reason: str = "",
        *,
        for_room: bool = False,
    ) -> Answered:
        """Take ``sender``'s answer to ``approval``: what to tell them, and if it decided.

        ``for_room``: keep the answer as a rule of the room (allow or deny);
        ``ALLOW_SESSION`` keeps an allow rule of the run's session.
        """
        settings = self.rooms(approval.room)
        if settings is None:
            return Answered(None, False)
        senders = await self.batch_senders(approval)
        if approval.tool_name == ASK:
            verdict = judge_answer(settings, sender, senders)
        else:
            verdict = judge(settings, sender, senders)
        if verdict is not Verdict.APPROVER:
            self.refused(verdict)
            return Answered(refusal(verdict), False)
        unfit = unanswerable(approval, choice, reason)
        if unfit is not None and approval.state is ApprovalState.PENDING:
            return Answered(unfit, False)
        if approval.state is ApprovalState.PENDING:
            decided = await self.store.decide_approval(
                approval, ApprovalDecision(state_of(choice), sender, self.wall_clock(), reason)
            )
            if decided:
                current = await self._current(approval)
                # A question's answer or a plan's start keeps no tool rule ("edits"
                # starts a plan with edits accepted: that is claude's own mode).
                kept, said = (
                    (None, "")
                    if approval.tool_name in INTERACTIVE
                    else await self._keep(sender, current, choice, for_room)
                )
                told = (
                    deny_text(approval.tool_name, reason) if choice is ApprovalChoice.DENY else ""
                )
                note = await self.live.decide(current, choice, sender, told, shown=said)
                if kept is not None:
                    await self.live.apply_rules(current.room)
                text = " ".join(part for part in (outcome(current), said, note) if part)
                return Answered(text, True)
        # Someone else answered first (or it had ended): say how it stands.
        current = await self._current(approval)
        return Answered(f"Already answered. {outcome(current)}", False)

    async def _keep(
        self, sender: UserId, approval: Approval, choice: ApprovalChoice, for_room: bool
    ) -> tuple[ToolRule | None, str]:
        """Keep the rule the answer asked for, if any: the rule kept, and what to tell
        the room of it."""
        if for_room:
            scope = RuleScope.ROOM
        elif choice is ApprovalChoice.ALLOW_SESSION:
            scope = RuleScope.SESSION
        else:
            return None, ""
        effect = RuleEffect.DENY if choice is ApprovalChoice.DENY else RuleEffect.ALLOW
        wanted = rule_for(approval.tool_name, parse_input(approval.input_json))
        if wanted is None:
            return None, "No rule was kept: nothing narrower than the whole tool covers this use."
        if not keepable(wanted):
            return None, "No rule was kept: the use is too long to keep as a rule."
        rule = str(wanted)
        session = None
        if scope is RuleScope.SESSION:
            session = await self.live.session_of(approval)
            if session is None:
                return None, "No rule was kept: the run's Claude session is not known."
        try:
            kept = await self.store.add_rule(
                NewRule(
                    approval.room,
                    scope=scope,
                    effect=effect,
                    rule=rule,
                    session_id=session,
                    created_by=sender,
                    at=self.wall_clock(),
                )
            )
        except StoreError:
            log.warning("could not keep the rule of request #%d", approval.number, exc_info=True)
            return None, "No rule was kept: the database failed."
        where = "this session" if scope is RuleScope.SESSION else "this room"
        said = f"Kept rule {kept.id}: {effect.value} {code_span(rule)} in {where}."
        return kept, f"{said} {DENY_REACH}" if effect is RuleEffect.DENY else said

    async def expire_due(self) -> list[Approval]:
        """Deny every request nobody answered in time, telling claude it timed out."""
        now = self.wall_clock()
        expired = []
        for approval in await self.store.expired_approvals(now):
            if not self.owns(approval.room):
                continue  # its run is another replica's, which tells it
            # The wait it was asked with, whatever the settings say now.
            message = timeout_message(approval.expires_at - approval.asked_at)
            if await self.store.decide_approval(
                approval, ApprovalDecision(ApprovalState.EXPIRED, None, now, "timed out")
            ):
                current = await self._current(approval)
                await self.live.decide(current, ApprovalChoice.DENY, None, message)
                expired.append(current)
        return expired

    async def batch_senders(self, approval: Approval) -> set[UserId]:
        """Who sent the messages the request's run works on."""
        run = await self.store.get_run(approval.run_id)
        if run is None:
            return set()
        return {m.sender for m in await self.store.messages(run.message_ids)}

    async def _current(self, approval: Approval) -> Approval:
        found = await self.store.approval_by_number(approval.room, approval.number)
        return approval if found is None else found

"""Answering tool-use requests: one path for commands, buttons, reactions and expiry.

Each answer is judged (:mod:`bridge.approvals`), recorded by the store's
compare-and-set, and only then handed to the run: of two approvers
answering at once, exactly one reaches claude.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bridge.approvals import Verdict, judge, judge_answer, refusal, state_of, timeout_message
from bridge.config import RoomSettings
from bridge.core.model import RoomKey, UserId
from bridge.core.transport import ApprovalChoice
from bridge.live_controls import LiveControls
from bridge.questions import ASK, deny_text, outcome, unanswerable
from bridge.store.base import Approval, ApprovalState, Store


@dataclass(slots=True)
class ApprovalDesk:
    store: Store
    rooms: Callable[[RoomKey], RoomSettings | None]
    live: LiveControls
    refused: Callable[[Verdict], None]
    """Counts an answer that was not taken (the metrics)."""
    wall_clock: Callable[[], float] = time.time
    owns: Callable[[RoomKey], bool] = lambda room: True
    """Expires only the requests of conversations this process runs (replicas)."""

    async def answer(
        self, sender: UserId, approval: Approval, choice: ApprovalChoice, reason: str = ""
    ) -> str | None:
        """Take ``sender``'s answer to ``approval``; returns what to tell them (None: nothing)."""
        settings = self.rooms(approval.room)
        if settings is None:
            return None
        senders = await self.batch_senders(approval)
        if approval.tool_name == ASK:
            verdict = judge_answer(settings, sender, senders)
        else:
            verdict = judge(settings, sender, senders)
        if verdict is not Verdict.APPROVER:
            self.refused(verdict)
            return refusal(verdict)
        unfit = unanswerable(approval, choice, reason)
        if unfit is not None and approval.state is ApprovalState.PENDING:
            return unfit
        if approval.state is ApprovalState.PENDING:
            decided = await self.store.decide_approval(
                approval, state_of(choice), sender, self.wall_clock(), reason
            )
            if decided:
                current = await self._current(approval)
                told = (
                    deny_text(approval.tool_name, reason) if choice is ApprovalChoice.DENY else ""
                )
                note = await self.live.decide(current, choice, sender, told)
                return f"{outcome(current)} {note}".rstrip()
        # Someone else answered first (or it had ended): say how it stands.
        current = await self._current(approval)
        return f"Already answered. {outcome(current)}"

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
                approval, ApprovalState.EXPIRED, None, now, "timed out"
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

"""What the console does on a person's behalf: answer a tool request as an approver (docs/web.md).

The answer goes through the same :class:`~bridge.live.approval_desk.ApprovalDesk`
as a chat command: the same rules (only the room's approvers, never one's own
run with ``require_other_approver``), the same compare-and-set and the same
audit rows, with the person's chat id as the actor.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from bridge.config import RoomSettings
from bridge.core.model import RoomKey, UserId
from bridge.core.text import visible
from bridge.core.transport import ApprovalChoice
from bridge.host.worktrees import in_worktree
from bridge.live.approval_desk import ApprovalDesk
from bridge.live.approvals import Verdict, judge, refusal
from bridge.live.questions import INTERACTIVE
from bridge.live.tool_view import render
from bridge.store.base import Approval, ApprovalStore


@dataclass(slots=True)
class DeskActions:
    store: ApprovalStore
    desk: ApprovalDesk
    rooms: Callable[[RoomKey], RoomSettings | None]

    def shown(self, approval: Approval) -> str:
        """The request whole, as the room is shown it (:mod:`bridge.live.tool_view`): every
        field in full, edits as a diff of the file as it is now."""
        try:
            data = json.loads(approval.input_json)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            return visible(f"{approval.tool_name}\n{approval.input_json}", keep_newlines=True)
        settings = self.rooms(approval.room)
        cwd = None if settings is None else in_worktree(approval.room, settings).cwd
        return render(approval.tool_name, data, cwd).markdown()

    async def answer(
        self, chat_ids: tuple[str, ...], approval_id: int, choice: ApprovalChoice, reason: str
    ) -> str:
        pending = [a for a in await self.store.pending_approvals() if a.id == approval_id]
        if not pending:
            return "That request is no longer waiting."
        approval = pending[0]
        settings = self.rooms(approval.room)
        if settings is None:
            return "That request's room is not configured here."
        senders = await self.desk.batch_senders(approval)
        own = settings.require_other_approver and approval.tool_name not in INTERACTIVE
        if own and any(UserId(c) in senders for c in chat_ids):
            # One person, several chat ids: another of their ids may not approve their own run.
            return refusal(Verdict.OWN_RUN) or ""
        for chat_id in chat_ids:
            if judge(settings, UserId(chat_id), senders) is Verdict.APPROVER:
                answered = await self.desk.take(UserId(chat_id), approval, choice, reason)
                return answered.text or "Answered."
        return "You may not answer this request: none of your chat ids is an approver there."

"""The SQL store's :class:`~bridge.store.base.ApprovalStore`: tool-use requests and their answers.

Deciding is a compare-and-set: of two answers at once, one wins (docs/live-runs.md).
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from bridge.core.model import ExternalMessageId, RoomKey, RunId
from bridge.store import audit_entries
from bridge.store.base import Approval, ApprovalAsk, ApprovalDecision, ApprovalState, StoreError
from bridge.store.keys import stored_id as _stored_id
from bridge.store.rules import approval_reason, require_decision
from bridge.store.sql.rows import approval_values, audit_row, decision_values, to_approval
from bridge.store.sql.shared import MAX_NUMBER, SqlBase, in_room, of_conversation, pending_rows
from bridge.store.tables import ApprovalRow, RoomRow, ToolRuleRow


class ApprovalsSql(SqlBase):
    """Tool-use requests asked in rooms."""

    async def add_approval(self, ask: ApprovalAsk) -> Approval:
        """Record a pending request under the room's next number; a replay returns the first.

        The number comes from the room's counter, raised in the same
        transaction: the upsert locks the room's row, so concurrent requests
        of a room (even from two stores) get distinct numbers.
        """

        room, run_id, request_id = ask.room, ask.run_id, ask.request_id

        def body(s: Session) -> Approval:
            existing = self._approval_of_request(s, run_id, request_id)
            if existing is not None:
                return existing
            counter = self._insert(RoomRow).values(
                transport=room.transport, room_id=_stored_id(room), last_approval=1
            )
            number = s.scalar(
                counter.on_conflict_do_update(
                    index_elements=["transport", "room_id"],
                    set_={"last_approval": RoomRow.last_approval + 1},
                ).returning(RoomRow.last_approval)
            )
            if number is None:  # an upsert returns its row; never seen
                raise StoreError("the room's approval counter returned nothing")
            # DO NOTHING: the same request recorded meanwhile (another store
            # replaying it) is found below, not an integrity error.
            inserted = s.scalar(
                self._insert(ApprovalRow)
                .values(approval_values(ask, number))
                .on_conflict_do_nothing(index_elements=["run_id", "request_id"])
                .returning(ApprovalRow.id)
            )
            approval = self._approval_of_request(s, run_id, request_id)
            if approval is None:  # inserted, or found by the insert: never seen
                raise StoreError(f"approval request {request_id} vanished")
            if inserted is not None:
                s.add(audit_row(audit_entries.approval_asked(approval)))
            return approval

        return await self._write(body)

    def _approval_of_request(self, s: Session, run_id: RunId, request_id: str) -> Approval | None:
        row = s.scalar(
            select(ApprovalRow).where(
                ApprovalRow.run_id == run_id, ApprovalRow.request_id == request_id
            )
        )
        return None if row is None else to_approval(row)

    async def set_approval_message(self, approval: Approval, message_id: ExternalMessageId) -> None:
        """Remember the room message that asks."""

        def body(s: Session) -> None:
            s.execute(
                update(ApprovalRow)
                .where(ApprovalRow.id == approval.id)
                .values(message_id=message_id)
            )

        await self._write(body)

    async def pending_approvals(self, room: RoomKey | None = None) -> list[Approval]:
        """Pending requests, of one room or of all, oldest first."""
        query = pending_rows(ApprovalRow, room)
        return await self._read_rows(query, to_approval)

    async def approval_by_number(self, room: RoomKey, number: int) -> Approval | None:
        """The room's request with this number, whatever its state."""
        if not 0 < number <= MAX_NUMBER:
            return None  # no such row, and a bound parameter PostgreSQL could not take
        found = await self._approvals(
            *of_conversation(ApprovalRow, room), ApprovalRow.number == number
        )
        return found[0] if found else None

    async def approval_by_message(
        self, room: RoomKey, message_id: ExternalMessageId
    ) -> Approval | None:
        """The room's request asked by this message, whatever its state."""
        found = await self._approvals(
            ApprovalRow.transport == room.transport,
            in_room(ApprovalRow.room_id, room),
            ApprovalRow.message_id == message_id,
        )
        return found[0] if found else None

    async def _approvals(self, *where: ColumnElement[bool]) -> list[Approval]:
        query = select(ApprovalRow).where(*where).order_by(ApprovalRow.id)
        return await self._read_rows(query, to_approval)

    async def decide_approval(self, approval: Approval, decision: ApprovalDecision) -> bool:
        """Decide the request if it is still pending and its rule (if any) holds (one
        conditional UPDATE), audited."""
        require_decision(decision.state)
        decision = replace(decision, reason=approval_reason(decision.reason))
        rule_id = decision.rule_id
        holds = []
        if rule_id is not None:
            if not 0 < rule_id <= MAX_NUMBER:
                return False
            rule = select(ToolRuleRow.id).where(
                ToolRuleRow.id == rule_id, ToolRuleRow.revoked_at.is_(None)
            )
            holds.append(rule.exists())

        def body(s: Session) -> bool:
            decided = s.scalar(
                update(ApprovalRow)
                .where(
                    ApprovalRow.id == approval.id,
                    ApprovalRow.state == ApprovalState.PENDING.value,
                    *holds,
                )
                .values(decision_values(decision))
                .returning(ApprovalRow.id)
            )
            if decided is None:
                return False
            s.add(audit_row(audit_entries.approval_decided(approval, decision)))
            return True

        return await self._write(body)

    async def cancel_approvals(
        self, run_id: RunId, why: str, at: float, request_ids: tuple[str, ...] | None = None
    ) -> list[Approval]:
        """Cancel the run's pending requests (or those of ``request_ids``), one audit row each."""
        cancel = ApprovalDecision(ApprovalState.CANCELLED, None, at, approval_reason(why))
        which = [ApprovalRow.run_id == run_id, ApprovalRow.state == ApprovalState.PENDING.value]
        if request_ids is not None:
            which.append(ApprovalRow.request_id.in_(list(request_ids)))

        def body(s: Session) -> list[Approval]:
            rows = (
                s.scalars(
                    update(ApprovalRow)
                    .where(*which)
                    .values(decision_values(cancel))
                    .returning(ApprovalRow)
                )
            ).all()
            cancelled = [to_approval(r) for r in sorted(rows, key=lambda r: r.id)]
            for approval in cancelled:
                s.add(audit_row(audit_entries.approval_decided(approval, cancel)))
            return cancelled

        return await self._write(body)

    async def expired_approvals(self, now: float) -> list[Approval]:
        """Pending requests due to expire, oldest first (they stay pending)."""
        return await self._approvals(
            ApprovalRow.state == ApprovalState.PENDING.value, ApprovalRow.expires_at <= now
        )

"""The SQL store's :class:`~bridge.store.base.RuleStore`: the tool rules chatbridge keeps
(docs/live-runs.md).
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from bridge.core.model import RoomKey, SessionId, UserId
from bridge.store import audit_entries
from bridge.store.base import NewRule, RuleScope, ToolRule
from bridge.store.keys import stored_id as _stored_id
from bridge.store.rules import require_rule
from bridge.store.sql.rows import audit_row, to_tool_rule
from bridge.store.sql.shared import MAX_NUMBER, SqlBase, of_conversation
from bridge.store.tables import ToolRuleRow


class RulesSql(SqlBase):
    """Tool rules, kept per channel."""

    async def add_rule(self, new: NewRule) -> ToolRule:
        """Keep a rule for the room's channel, audited, in one transaction."""
        require_rule(new.scope, new.session_id, new.rule)
        channel = new.room.channel

        def body(s: Session) -> ToolRule:
            row = ToolRuleRow(
                transport=channel.transport,
                room_id=_stored_id(channel),
                scope=new.scope.value,
                session_id=new.session_id,
                effect=new.effect.value,
                rule=new.rule,
                created_by=new.created_by,
                created_at=new.at,
            )
            s.add(row)
            s.flush()
            kept = new.kept(row.id)
            s.add(audit_row(audit_entries.rule_added(kept)))
            return kept

        return await self._write(body)

    async def active_rules(self, room: RoomKey, session_id: SessionId | None) -> list[ToolRule]:
        """The channel's unrevoked room rules and ``session_id``'s, oldest first."""
        channel = room.channel
        scoped = ToolRuleRow.scope == RuleScope.ROOM.value
        if session_id is not None:
            scoped = scoped | (ToolRuleRow.session_id == session_id)
        query = (
            select(ToolRuleRow)
            .where(
                *of_conversation(ToolRuleRow, channel),
                ToolRuleRow.revoked_at.is_(None),
                scoped,
            )
            .order_by(ToolRuleRow.id)
        )
        return await self._read_rows(query, to_tool_rule)

    async def revoke_rule(
        self, room: RoomKey, rule_id: int, actor: UserId, at: float
    ) -> ToolRule | None:
        """End an unrevoked rule of the channel (one conditional UPDATE), audited."""
        channel = room.channel
        if not 0 < rule_id <= MAX_NUMBER:
            return None  # no such id, and the driver would refuse the query

        def body(s: Session) -> ToolRule | None:
            row = s.scalars(
                update(ToolRuleRow)
                .where(
                    ToolRuleRow.id == rule_id,
                    *of_conversation(ToolRuleRow, channel),
                    ToolRuleRow.revoked_at.is_(None),
                )
                .values(revoked_by=actor, revoked_at=at)
                .returning(ToolRuleRow)
            ).one_or_none()
            if row is None:
                return None
            revoked = to_tool_rule(row)
            s.add(audit_row(audit_entries.rule_revoked(revoked)))
            return revoked

        return await self._write(body)

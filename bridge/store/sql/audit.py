"""The SQL store's :class:`~bridge.store.base.AuditStore`: the audit trail."""

from __future__ import annotations

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from bridge.store.base import WHOLE_TRAIL, AuditEntry, AuditFilter, AuditRecord
from bridge.store.sql.rows import audit_row, to_audit_record
from bridge.store.sql.shared import SqlBase, of_conversation
from bridge.store.tables import AuditRow


class AuditSql(SqlBase):
    """The audit trail."""

    async def audit(self, entry: AuditEntry) -> None:
        """Append one audit row."""

        def body(s: Session) -> None:
            s.add(audit_row(entry))

        await self._write(body)

    async def audit_trail(self, which: AuditFilter = WHOLE_TRAIL) -> list[AuditRecord]:
        """The audit rows ``which`` reads, in the order they were written."""
        conditions: list[ColumnElement[bool]] = []
        if which.room is not None:
            conditions += of_conversation(AuditRow, which.room)
        if which.message_id is not None:
            conditions.append(AuditRow.message_id == which.message_id)
        if which.run_id is not None:
            conditions.append(AuditRow.run_id == which.run_id)

        query = select(AuditRow).where(*conditions).order_by(AuditRow.id)
        return await self._read_rows(query, to_audit_record)

"""The SQL store: every role's mixin in one :class:`SqlStore`, its opening and its upkeep."""

from __future__ import annotations

import time

from sqlalchemy import delete, exists, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from bridge.core.model import RunStatus
from bridge.store.base import ApprovalState, DeliveryState, StoreError
from bridge.store.engine import DEFAULT_URL, create_engine, is_sqlite_file, redacted
from bridge.store.keys import THREAD_SEPARATOR
from bridge.store.migrate import connect_failure, head_revision, migrate, newer_schema, revision_of
from bridge.store.sql.approvals import ApprovalsSql
from bridge.store.sql.audit import AuditSql
from bridge.store.sql.ledger import LedgerSql
from bridge.store.sql.live_runs import LiveRunsSql
from bridge.store.sql.marks import MarksSql
from bridge.store.sql.messages import MessagesSql
from bridge.store.sql.outbox import OutboxSql
from bridge.store.sql.rooms import RoomsSql
from bridge.store.sql.runs import RunsSql
from bridge.store.sql.shared import LIVE, rowcount
from bridge.store.sql.tool_rules import RulesSql
from bridge.store.tables import (
    ApprovalRow,
    AuditRow,
    MessageRow,
    OutboxRow,
    RunMessageRow,
    RunRow,
    SeenMarkRow,
    SpendRow,
)


def _require_head(url: str, found: str | None) -> None:
    expected = head_revision()
    newer = newer_schema(found)
    if newer is not None:
        # `chatbridge migrate` cannot help: it would refuse the same way.
        raise StoreError(newer)
    if found != expected:
        raise StoreError(
            f"the database at {redacted(url)} is at schema revision {found or 'none'},"
            f" this version needs {expected}: run `chatbridge migrate`"
        )


class SqlStore(
    MessagesSql,
    RunsSql,
    LiveRunsSql,
    OutboxSql,
    RoomsSql,
    LedgerSql,
    ApprovalsSql,
    RulesSql,
    AuditSql,
    MarksSql,
):
    """:class:`~bridge.store.base.Store` on SQLite (default) or PostgreSQL.

    Create it with :meth:`open`; :meth:`close` releases its connections.
    """

    @classmethod
    async def open(
        cls,
        url: str = DEFAULT_URL,
        *,
        auto_migrate: bool = True,
        idle_transaction_timeout_s: float | None = None,
    ) -> SqlStore:
        """Connect to ``url``, migrating its schema to head first if ``auto_migrate``.

        Without ``auto_migrate`` a database whose schema is not at head is an
        error: the operator runs ``chatbridge migrate`` deliberately.
        """
        if auto_migrate:
            await migrate(url)
        engine = create_engine(url, idle_transaction_timeout_s=idle_transaction_timeout_s)
        started = time.monotonic()
        try:
            async with engine.connect() as conn:
                _require_head(url, await revision_of(conn))
        except (SQLAlchemyError, OSError) as exc:
            await engine.dispose()
            why = connect_failure(exc, started)
            raise StoreError(f"cannot open the store at {redacted(url)}: {why}") from exc
        except BaseException:
            await engine.dispose()
            raise
        if is_sqlite_file(url):
            # The store reads and writes the file through connections of its own
            # (InThreads): this one, and its aiosqlite thread, would only idle.
            await engine.dispose()
        return cls(engine)

    async def prune(self, older_than: float) -> int:
        """Delete old audit rows, old finished messages and runs left empty.

        Messages still pending or dispatched and running runs are kept
        whatever their age. A finished run is deleted once it ended before
        the cutoff and none of its messages remain. Outbox entries and
        approvals finished before the cutoff go too. Returns the number of
        rows deleted.
        """

        def body(s: Session) -> int:
            audit = s.execute(delete(AuditRow).where(AuditRow.at < older_than))
            messages = s.execute(
                delete(MessageRow).where(
                    MessageRow.received_at < older_than, MessageRow.state.not_in(LIVE)
                )
            )
            runs = s.execute(
                delete(RunRow).where(
                    RunRow.status != RunStatus.RUNNING.value,
                    RunRow.ended_at < older_than,
                    # run_messages rows vanish with their messages (ON DELETE CASCADE);
                    # a live_runs row, which a run that ended no longer has,
                    # would vanish with its run.
                    ~exists().where(RunMessageRow.run_id == RunRow.id),
                )
            )
            # A finished entry's next_attempt_at is when it finished.
            outbox = s.execute(
                delete(OutboxRow).where(
                    OutboxRow.state != DeliveryState.PENDING.value,
                    OutboxRow.next_attempt_at < older_than,
                )
            )
            approvals = s.execute(
                delete(ApprovalRow).where(
                    ApprovalRow.state != ApprovalState.PENDING.value,
                    ApprovalRow.decided_at < older_than,
                )
            )
            spend = s.execute(delete(SpendRow).where(SpendRow.at < older_than))
            # Threads' marks only: a room's own is where its catch-up starts.
            marks = s.execute(
                delete(SeenMarkRow).where(
                    SeenMarkRow.room_id.contains(THREAD_SEPARATOR, autoescape=True),
                    SeenMarkRow.seen_at < older_than,
                )
            )
            counts = (audit, messages, runs, outbox, approvals, spend, marks)
            return sum(rowcount(c) for c in counts)

        return await self._write(body)

    async def ping(self) -> None:
        """Raise StoreError unless the database answers."""

        def body(s: Session) -> None:
            s.execute(text("SELECT 1"))

        await self._read(body)

    async def close(self) -> None:
        """Close every pooled connection and refuse further use."""
        self._closed = True
        self._accepts.fail_queued(lambda: StoreError("the store is closed"))
        self._finishes.fail_queued(lambda: StoreError("the store is closed"))
        self._entry_updates.fail_queued(lambda: StoreError("the store is closed"))
        # A connection still checked out when the pool is disposed is never
        # closed properly: let the transactions in flight end first.
        await self._accepts.idle()
        await self._finishes.idle()
        await self._entry_updates.idle()
        await self._tx.close()
        await self._engine.dispose()

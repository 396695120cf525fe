"""What the console shows, read from the database with SQLAlchemy Core (docs/web.md).

Read-only and replica-neutral: every query reads the shared tables, so any
replica answers the same. Search text is matched with ``LIKE`` with its
wildcards escaped; limits bound every list.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from bridge.core.model import Message, MessageId, RoomKey, RunReport
from bridge.store.base import Approval, AuditRecord, RunRecord
from bridge.store.keys import stored_id
from bridge.store.sql.rows import to_approval, to_audit_record, to_message, to_run_record
from bridge.store.tables import (
    ApprovalRow,
    AuditRow,
    MessageRow,
    OutboxRow,
    RunMessageRow,
    RunRow,
    SpendRow,
)

PAGE = 50
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as the store keeps it, with its place in the list (``seq``) and its batch:
    the senders (each once) and the first message as the prompt."""

    record: RunRecord
    seq: int
    senders: tuple[str, ...] = ()
    prompt: str = ""

    @property
    def conversation(self) -> str:
        return conversation_name(self.record.room)

    @property
    def report(self) -> RunReport:
        """How the run ended; nothing yet (no cost, no answer) while it runs."""
        return self.record.report or RunReport(self.record.status)

    @property
    def duration_s(self) -> float | None:
        ended = self.record.ended_at
        return None if ended is None else ended - self.record.started_at


@dataclass(frozen=True, slots=True)
class AnswerView:
    text: str
    kind: str
    state: str
    created: float


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: RunView
    messages: list[Message]
    answers: list[AnswerView]
    audit: list[AuditRecord]


@dataclass(frozen=True, slots=True)
class Waiting:
    """A conversation with something going on: a run, queued messages, open requests."""

    conversation: str
    run: RunView | None = None
    queued: list[Message] = field(default_factory=list)
    requests: list[Approval] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SpendDay:
    day: str
    total: float
    by_room: dict[str, float]
    runs: int


@dataclass(frozen=True, slots=True)
class AuditQuery:
    action: str = ""
    conversation: str = ""
    actor: str = ""
    run_id: str = ""
    before_id: int | None = None
    limit: int = PAGE


@dataclass(frozen=True, slots=True)
class RunQuery:
    text: str = ""
    conversation: str = ""
    status: str = ""
    before_seq: int | None = None
    limit: int = PAGE


def conversation_of(transport: str, room_id: str) -> str:
    return f"{transport}:{room_id}"


def conversation_name(room: RoomKey) -> str:
    """``room`` as the console names it: :func:`conversation_of` its row's columns."""
    return conversation_of(room.transport, stored_id(room))


def _split(conversation: str) -> tuple[str, str] | None:
    transport, sep, room_id = conversation.partition(":")
    return (transport, room_id) if sep and transport and room_id else None


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _run_view(row: RunRow, batch: Sequence[MessageRow]) -> RunView:
    """``row`` with its batch's senders (each once) and its first message as the prompt."""
    record = to_run_record(row, tuple(MessageId(m.id) for m in batch))
    senders = tuple(dict.fromkeys(m.sender for m in batch))
    return RunView(record, row.seq, senders, batch[0].text if batch else "")


async def _rows(conn: AsyncSession, query: Select[T]) -> list[T]:
    """The rows ``query`` selects (one entity or column), in ``conn``'s transaction."""
    return list((await conn.execute(query)).scalars().all())


def day_of(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d")


@dataclass(slots=True)
class Reads:
    engine: AsyncEngine

    async def _scalars(self, query: Select[T]) -> list[T]:
        async with AsyncSession(self.engine) as conn:
            return await _rows(conn, query)

    async def runs(self, q: RunQuery) -> list[RunView]:
        query = select(RunRow).order_by(RunRow.seq.desc()).limit(min(q.limit, 500))
        if q.before_seq is not None:
            query = query.where(RunRow.seq < q.before_seq)
        if q.status:
            query = query.where(RunRow.status == q.status)
        if (where := _split(q.conversation)) is not None:
            query = query.where(RunRow.transport == where[0], RunRow.room_id == where[1])
        if q.text:
            pattern = _like(q.text)
            matching = (
                select(RunMessageRow.run_id)
                .join(MessageRow, MessageRow.id == RunMessageRow.message_id)
                .where(MessageRow.text.like(pattern, escape="\\"))
            )
            query = query.where(
                or_(
                    RunRow.id.in_(matching),
                    RunRow.result_excerpt.like(pattern, escape="\\"),
                    RunRow.id.like(pattern, escape="\\"),
                )
            )
        async with AsyncSession(self.engine) as conn:
            rows = await _rows(conn, query)
            batches = await self._batches(conn, [r.id for r in rows])
        return [_run_view(r, batches[r.id]) for r in rows]

    async def _batches(
        self, conn: AsyncSession, run_ids: Iterable[str]
    ) -> dict[str, list[MessageRow]]:
        ids = list(run_ids)
        found: dict[str, list[MessageRow]] = defaultdict(list)
        if not ids:
            return found
        query = (
            select(RunMessageRow.run_id, MessageRow)
            .join(MessageRow, MessageRow.id == RunMessageRow.message_id)
            .where(RunMessageRow.run_id.in_(ids))
            .order_by(RunMessageRow.run_id, RunMessageRow.position)
        )
        for run_id, message in (await conn.execute(query)).all():
            found[run_id].append(message)
        return found

    async def run(self, run_id: str) -> RunDetail | None:
        async with AsyncSession(self.engine) as conn:
            row = (await conn.execute(select(RunRow).where(RunRow.id == run_id))).scalar()
            if row is None:
                return None
            batch = (await self._batches(conn, [run_id]))[run_id]
            answers = await _rows(
                conn, select(OutboxRow).where(OutboxRow.run_id == run_id).order_by(OutboxRow.id)
            )
            audit = await _rows(
                conn, select(AuditRow).where(AuditRow.run_id == run_id).order_by(AuditRow.id)
            )
            return RunDetail(
                run=_run_view(row, batch),
                messages=[to_message(m) for m in batch],
                answers=[AnswerView(a.text, a.kind, a.state, a.created) for a in answers],
                audit=[to_audit_record(a) for a in audit],
            )

    async def waiting(self) -> list[Waiting]:
        """Conversations with a run going, messages queued or requests open, oldest first."""
        async with AsyncSession(self.engine) as conn:
            running = await _rows(
                conn, select(RunRow).where(RunRow.status == "running").order_by(RunRow.seq)
            )
            batches = await self._batches(conn, [r.id for r in running])
            pending = await _rows(
                conn,
                select(MessageRow)
                .where(MessageRow.state == "pending")
                .order_by(MessageRow.id)
                .limit(1000),
            )
            asks = await _rows(
                conn,
                select(ApprovalRow).where(ApprovalRow.state == "pending").order_by(ApprovalRow.id),
            )
        found: dict[str, Waiting] = {}

        def slot(conversation: str) -> Waiting:
            return found.setdefault(conversation, Waiting(conversation))

        for r in running:
            view = _run_view(r, batches[r.id])
            found[view.conversation] = Waiting(
                view.conversation,
                view,
                slot(view.conversation).queued,
                slot(view.conversation).requests,
            )
        for m in pending:
            slot(conversation_of(m.transport, m.room_id)).queued.append(to_message(m))
        for a in asks:
            slot(conversation_of(a.transport, a.room_id)).requests.append(to_approval(a))
        return list(found.values())

    async def approvals(self) -> list[Approval]:
        rows = await self._scalars(
            select(ApprovalRow).where(ApprovalRow.state == "pending").order_by(ApprovalRow.id)
        )
        return [to_approval(r) for r in rows]

    async def approval(self, approval_id: int) -> Approval | None:
        rows = await self._scalars(select(ApprovalRow).where(ApprovalRow.id == approval_id))
        return to_approval(rows[0]) if rows else None

    async def spend(self, days: int, now: float | None = None) -> list[SpendDay]:
        """Spending per UTC day, oldest first, over the last ``days`` days; each room's share."""
        now = time.time() if now is None else now
        since = now - days * 86400
        query = select(SpendRow.transport, SpendRow.room_id, SpendRow.at, SpendRow.cost_usd).where(
            SpendRow.at >= since
        )
        async with AsyncSession(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        per_day: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        count: dict[str, int] = defaultdict(int)
        for transport, room_id, at, cost in rows:
            day = day_of(at)
            per_day[day][conversation_of(transport, room_id.partition("/")[0])] += cost or 0.0
            count[day] += 1
        result = []
        for offset in range(days - 1, -1, -1):
            day = day_of(now - offset * 86400)
            rooms = dict(per_day.get(day, {}))
            result.append(SpendDay(day, sum(rooms.values()), rooms, count.get(day, 0)))
        return result

    async def audit(self, q: AuditQuery) -> list[AuditRecord]:
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(min(q.limit, 500))
        conditions = []
        if q.before_id is not None:
            conditions.append(AuditRow.id < q.before_id)
        if q.action:
            conditions.append(AuditRow.action == q.action)
        if q.actor:
            conditions.append(AuditRow.actor == q.actor)
        if q.run_id:
            conditions.append(AuditRow.run_id == q.run_id)
        if (where := _split(q.conversation)) is not None:
            conditions += [AuditRow.transport == where[0], AuditRow.room_id == where[1]]
        if conditions:
            query = query.where(and_(*conditions))
        return [to_audit_record(a) for a in await self._scalars(query)]

    async def fingerprint(self) -> tuple[object, ...]:
        """Changes whenever something the pages show changes (new audit rows, answers, runs)."""
        query = select(
            select(func.max(AuditRow.id)).scalar_subquery(),
            select(func.max(OutboxRow.id)).scalar_subquery(),
            select(func.max(RunRow.seq)).scalar_subquery(),
            select(func.count())
            .select_from(RunRow)
            .where(RunRow.status == "running")
            .scalar_subquery(),
            select(func.count())
            .select_from(MessageRow)
            .where(MessageRow.state == "pending")
            .scalar_subquery(),
        )
        async with AsyncSession(self.engine) as conn:
            return tuple((await conn.execute(query)).one())

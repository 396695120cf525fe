"""The SQL store's :class:`~bridge.store.base.MessageStore`: inbound messages.

``accept`` shares transactions between concurrent calls (group commit,
:mod:`bridge.store.batching`); every other method is one short transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, select, update
from sqlalchemy import insert as insert_statement
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from bridge.core.model import (
    ExternalMessageId,
    InboundMessage,
    Message,
    MessageId,
    MessageState,
    RoomKey,
    RunId,
    UserId,
)
from bridge.store import audit_entries
from bridge.store.base import AuditAction, StoreError
from bridge.store.batching import Committing, Failed, GroupCommit
from bridge.store.keys import room_key as _room
from bridge.store.sql.rows import (
    audit_row,
    audit_values,
    message_key,
    message_values,
    to_message,
)
from bridge.store.sql.shared import AUDIT, LIVE, MESSAGES, SqlBase, in_room, isolating, pending_rows
from bridge.store.tables import MessageRow

ACCEPT_GROUP_LIMIT = 256
"""Messages per group-commit transaction of :meth:`SqlStore.accept` at most."""


class MessagesSql(SqlBase):
    """Inbound messages: accepted, queued, edited, dropped."""

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self._accepts: GroupCommit[tuple[InboundMessage, float], Message | None] = GroupCommit(
            self._accept_group, limit=ACCEPT_GROUP_LIMIT
        )

    async def accept(self, msg: InboundMessage, received_at: float) -> Message | None:
        """Record ``msg`` as pending and audit it, or return None on redelivery.

        Concurrent calls share one transaction (group commit, see
        :mod:`bridge.store.batching`): each still returns only once its
        message is committed. A lost connection or a lock timeout fails
        every call in that transaction; a message the database refuses fails
        only its own call. A call cancelled once its transaction is under way
        may still have its message committed.
        """
        if self._closed:
            raise StoreError("the store is closed")
        return await self._accepts.submit((msg, received_at))

    async def _accept_group(
        self, group: Sequence[tuple[InboundMessage, float]], committing: Committing
    ) -> list[Message | Failed | None]:
        """Insert the messages not yet stored, in order, in one transaction."""
        return await isolating(group, self._accept_together, committing)

    async def _accept_together(
        self, group: Sequence[tuple[InboundMessage, float]], committing: Committing
    ) -> list[Message | None]:
        """Insert the messages not yet stored, in order, in one transaction.

        One INSERT for the messages and one for their audit rows, whatever
        the group's size: per-statement overhead, not the commit, would
        otherwise bound a group.
        """
        # A key twice in one group: the first is the message, later ones are
        # redeliveries, exactly as if they had come one after the other.
        first: dict[tuple[str, str, str], int] = {}
        for position, (msg, _) in enumerate(group):
            first.setdefault(message_key(msg), position)
        fresh = sorted(first.values())

        def body(s: Session) -> list[int | None]:
            # ON CONFLICT DO NOTHING rather than catching IntegrityError: a
            # message already stored (or being stored by another process,
            # whose commit this waits for) inserts nothing, and no other
            # integrity error is mistaken for redelivery. The statement is the
            # same whatever the group's size, so it is compiled once; with
            # RETURNING, SQLAlchemy sends the rows as one multi-row INSERT
            # ("insertmanyvalues"), whose rows get their ids in order.
            insert = self._insert(MESSAGES).on_conflict_do_nothing(
                index_elements=["transport", "room_id", "external_id"]
            )
            insert = insert.returning(
                MESSAGES.c.id, MESSAGES.c.transport, MESSAGES.c.room_id, MESSAGES.c.external_id
            )
            rows = s.execute(insert, [message_values(*group[p]) for p in fresh])
            # RETURNING order is unspecified: match rows by their key.
            new_ids: dict[tuple[str, str, str], int] = {(t, r, e): i for i, t, r, e in rows}
            ids = [
                new_ids.get(message_key(msg)) if first[message_key(msg)] == position else None
                for position, (msg, _) in enumerate(group)
            ]
            audit = [
                audit_values(audit_entries.accepted(msg, received_at, MessageId(new_id)))
                for new_id, (msg, received_at) in zip(ids, group, strict=True)
                if new_id is not None
            ]
            if audit:
                s.execute(insert_statement(AUDIT), audit)
            return ids

        ids = await self._write(body, committing=committing)
        return [
            None if new_id is None else msg.accepted(MessageId(new_id), received_at)
            for new_id, (msg, received_at) in zip(ids, group, strict=True)
        ]

    async def record_ignored(self, msg: InboundMessage, reason: str, at: float) -> None:
        """Audit a message that was not accepted, without its text."""

        def body(s: Session) -> None:
            s.add(audit_row(audit_entries.ignored(msg, reason, at)))

        await self._write(body)

    async def complete_command(self, message_id: MessageId) -> None:
        """Mark a pending command message done: commands never go into a run."""

        def body(s: Session) -> None:
            s.execute(
                update(MessageRow)
                .where(
                    MessageRow.id == message_id,
                    MessageRow.state == MessageState.PENDING.value,
                )
                .values(state=MessageState.DONE.value)
            )

        await self._write(body)

    async def pending_messages(self, room: RoomKey | None = None) -> list[Message]:
        """Every pending message (or ``room``'s), in acceptance order."""
        query = pending_rows(MessageRow, room)
        return await self._read_rows(query, to_message)

    async def mark_dropped(self, ids: Sequence[MessageId], actor: UserId | None, at: float) -> None:
        """Drop the pending or dispatched ones of these messages, one audit row each.

        Messages that already finished (done, failed, dropped) keep their state
        and get no audit row: ``!stop`` cannot undo what already happened.
        """

        def body(s: Session) -> None:
            rows = (
                s.scalars(
                    select(MessageRow)
                    .where(MessageRow.id.in_(ids), MessageRow.state.in_(LIVE))
                    .order_by(MessageRow.id)
                )
            ).all()
            for row in rows:
                row.state = MessageState.DROPPED.value
                room, message_id = _room(row.transport, row.room_id), MessageId(row.id)
                run_id = None if row.run_id is None else RunId(row.run_id)
                dropped = audit_entries.message_step(
                    AuditAction.MESSAGE_DROPPED, room, message_id, actor, at, run_id=run_id
                )
                s.add(audit_row(dropped))

        await self._write(body)

    async def pending_message(
        self, room: RoomKey, external_id: ExternalMessageId
    ) -> Message | None:
        """The pending message with this transport id in ``room``, or None."""

        def body(s: Session) -> Message | None:
            row = s.scalar(
                select(MessageRow).where(
                    MessageRow.transport == room.transport,
                    in_room(MessageRow.room_id, room),
                    MessageRow.external_id == external_id,
                    MessageRow.state == MessageState.PENDING.value,
                )
            )
            return None if row is None else to_message(row)

        return await self._read(body)

    async def edit_pending(
        self, message_id: MessageId, text: str, actor: UserId | None, at: float
    ) -> Message | None:
        """Replace a pending message's text and audit it; None if not pending or unchanged.

        The UPDATE's condition decides, so an edit racing the message's
        dispatch either lands before it or changes nothing.
        """
        return await self._change_pending(
            message_id,
            AuditAction.MESSAGE_EDITED,
            actor,
            at,
            {"text": text},
            MessageRow.text != text,
        )

    async def delete_pending(
        self, message_id: MessageId, actor: UserId | None, at: float
    ) -> Message | None:
        """Drop a pending message that was deleted and audit it; None if not pending."""
        return await self._change_pending(
            message_id,
            AuditAction.MESSAGE_DELETED,
            actor,
            at,
            {"state": MessageState.DROPPED.value},
        )

    async def _change_pending(
        self,
        message_id: MessageId,
        action: AuditAction,
        actor: UserId | None,
        at: float,
        values: dict[str, str],
        *conditions: ColumnElement[bool],
    ) -> Message | None:
        """Update a message only while it is pending and ``conditions`` hold; audit it."""

        def body(s: Session) -> Message | None:
            row = s.scalar(
                update(MessageRow)
                .where(
                    MessageRow.id == message_id,
                    MessageRow.state == MessageState.PENDING.value,
                    *conditions,
                )
                .values(**values)
                .returning(MessageRow)
            )
            if row is None:
                return None
            message = to_message(row)
            s.add(
                audit_row(audit_entries.message_step(action, message.room, message.id, actor, at))
            )
            return message

        return await self._write(body)

    async def messages(self, ids: Sequence[MessageId]) -> list[Message]:
        """The messages with these ids that exist, in acceptance order."""

        query = select(MessageRow).where(MessageRow.id.in_(ids)).order_by(MessageRow.id)
        return await self._read_rows(query, to_message)

    async def message_states(self, ids: Sequence[MessageId]) -> dict[MessageId, MessageState]:
        """The state of each of these messages that exists.

        For operators and tests; not part of the :class:`Store` protocol.
        """

        def body(s: Session) -> dict[MessageId, MessageState]:
            rows = s.execute(select(MessageRow.id, MessageRow.state).where(MessageRow.id.in_(ids)))
            return {MessageId(i): MessageState(state) for i, state in rows}

        return await self._read(body)

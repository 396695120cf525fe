"""The SQL store's :class:`~bridge.store.base.RoomStore` and
:class:`~bridge.store.base.TranscriptStore`: a conversation's session, overrides and transcript.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, delete, select
from sqlalchemy.orm import Session

from bridge.core.model import RoomKey, SessionId
from bridge.store.base import RoomOverrides, SessionTranscript, TranscriptStamp
from bridge.store.keys import stored_id as _stored_id
from bridge.store.sql.rows import session_rows
from bridge.store.sql.shared import SqlBase, of_conversation
from bridge.store.tables import RoomRow, SessionTranscriptRow


def _transcript_of(room: RoomKey) -> tuple[ColumnElement[bool], ...]:
    """The conditions picking the conversation's row of ``session_transcripts``."""
    return of_conversation(SessionTranscriptRow, room)


class RoomsSql(SqlBase):
    """A conversation's session, its overrides and its session's transcript."""

    async def get_session(self, room: RoomKey) -> SessionId | None:
        """The Claude session the room resumes, if any."""

        def body(s: Session) -> SessionId | None:
            row = s.get(RoomRow, (room.transport, _stored_id(room)))
            return None if row is None or row.session_id is None else SessionId(row.session_id)

        return await self._read(body)

    async def set_session(self, room: RoomKey, session_id: SessionId | None) -> None:
        """Remember (or, with None, forget) the Claude session of a room.

        It wins over the session of a run whose :meth:`finish_run` was called
        before and has not committed yet (see there).
        """
        # Counted before any await: a finish_run called from now on sees it.
        self._sessions_set += 1
        self._session_set_at[room] = self._sessions_set

        def body(s: Session) -> None:
            s.execute(self._sessions_upsert, session_rows({room: session_id}))
            if session_id is None:
                # A forgotten session is never resumed: its transcript goes with it.
                s.execute(delete(SessionTranscriptRow).where(*_transcript_of(room)))

        async with self._session_writes:
            await self._write(body)

    async def room_overrides(self, room: RoomKey) -> RoomOverrides:
        """The model and permission mode set by command for the room, if any."""
        return (await self.room_state(room))[1]

    async def room_state(self, room: RoomKey) -> tuple[SessionId | None, RoomOverrides]:
        """The room's session and overrides: one row, one read."""

        def body(s: Session) -> tuple[SessionId | None, RoomOverrides]:
            row = s.get(RoomRow, (room.transport, _stored_id(room)))
            if row is None:
                return None, RoomOverrides()
            session = None if row.session_id is None else SessionId(row.session_id)
            return session, RoomOverrides(row.model, row.permission_mode, row.fork_next)

        return await self._read(body)

    async def set_room_model(self, room: RoomKey, model: str | None) -> None:
        """Set (None: clear) the model of the room's next runs."""

        def body(s: Session) -> None:
            s.execute(self._room_upsert(room, model=model))

        await self._write(body)

    async def set_room_mode(self, room: RoomKey, mode: str | None) -> None:
        """Set (None: clear) the permission mode of the room's next runs."""

        def body(s: Session) -> None:
            s.execute(self._room_upsert(room, permission_mode=mode))

        await self._write(body)

    async def set_room_fork(self, room: RoomKey, fork: bool) -> None:
        """Whether the room's next run forks its session."""

        def body(s: Session) -> None:
            s.execute(self._room_upsert(room, fork_next=fork))

        await self._write(body)

    def _room_upsert(self, room: RoomKey, **values: Any) -> Any:
        """The room's row with ``values`` set, created if missing; its other columns kept."""
        upsert = self._insert(RoomRow).values(
            transport=room.transport, room_id=_stored_id(room), **values
        )
        return upsert.on_conflict_do_update(index_elements=["transport", "room_id"], set_=values)

    async def save_transcript(self, room: RoomKey, transcript: SessionTranscript) -> None:
        """Keep the conversation's transcript in place of the one it kept.

        Synced: a lost save could leave an older copy of the same session, which
        another replica would resume without the latest turns.
        """
        values = {
            "session_id": transcript.session_id,
            "content": transcript.content,
            "size": transcript.stamp.size,
            "digest": transcript.stamp.digest,
            "saved_at": transcript.saved_at,
        }
        upsert = self._insert(SessionTranscriptRow).values(
            transport=room.transport, room_id=_stored_id(room), **values
        )
        upsert = upsert.on_conflict_do_update(index_elements=["transport", "room_id"], set_=values)

        def body(s: Session) -> None:
            s.execute(upsert)

        await self._write(body)

    async def transcript_stamp(
        self, room: RoomKey, session_id: SessionId
    ) -> TranscriptStamp | None:
        """The stored transcript's stamp, if it is ``session_id``'s (its content stays put)."""
        query = select(SessionTranscriptRow.size, SessionTranscriptRow.digest).where(
            *_transcript_of(room), SessionTranscriptRow.session_id == session_id
        )

        def body(s: Session) -> TranscriptStamp | None:
            row = (s.execute(query)).first()
            return None if row is None else TranscriptStamp(row.size, row.digest)

        return await self._read(body)

    async def load_transcript(self, room: RoomKey, session_id: SessionId) -> bytes | None:
        """The stored transcript's content, if it is ``session_id``'s."""
        query = select(SessionTranscriptRow.content).where(
            *_transcript_of(room), SessionTranscriptRow.session_id == session_id
        )

        def body(s: Session) -> bytes | None:
            content: bytes | None = s.scalar(query)
            return content

        return await self._read(body)

    async def drop_transcript(self, room: RoomKey) -> None:
        """Forget the conversation's stored transcript."""

        def body(s: Session) -> None:
            s.execute(delete(SessionTranscriptRow).where(*_transcript_of(room)))

        await self._write(body)

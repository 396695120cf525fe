"""The store's session transcripts: one per conversation, of the session it resumes."""

from __future__ import annotations

import asyncio
import os

from bridge.core.model import RoomId, RoomKey, SessionId, TransportName
from bridge.store.base import SessionTranscript, TranscriptStamp
from tests.store.conftest import InspectableStore

ROOM = RoomKey(TransportName("matrix"), RoomId("!a:localhost"))
SLACK_ROOM = RoomKey(TransportName("slack"), RoomId("!a:localhost"))  # same id, other transport
THREAD = ROOM.in_thread("$root/with:odd chars%_")
S1, S2 = SessionId("0b5c1d7e-4a3f-4c2b-9d8e-000000000001"), SessionId("s2")


def stamp(size: int) -> TranscriptStamp:
    return TranscriptStamp(size, f"{size:064x}")


async def test_nothing_is_stored_at_first(store: InspectableStore) -> None:
    assert await store.transcript_stamp(ROOM, S1) is None
    assert await store.load_transcript(ROOM, S1) is None


async def test_a_saved_transcript_comes_back_whole_for_its_session_only(
    store: InspectableStore,
) -> None:
    # Not text: every byte value, and more than one page of it.
    content = os.urandom(300_000)
    await store.save_transcript(ROOM, SessionTranscript(S1, content, 100.0, stamp(1_000_000)))
    assert await store.load_transcript(ROOM, S1) == content
    assert await store.transcript_stamp(ROOM, S1) == stamp(1_000_000)
    assert await store.load_transcript(ROOM, S2) is None
    assert await store.transcript_stamp(ROOM, S2) is None


async def test_only_the_latest_save_is_kept(store: InspectableStore) -> None:
    await store.save_transcript(ROOM, SessionTranscript(S1, b"first", 100.0, stamp(10)))
    await store.save_transcript(ROOM, SessionTranscript(S1, b"first and more", 101.0, stamp(20)))
    assert await store.load_transcript(ROOM, S1) == b"first and more"
    assert await store.transcript_stamp(ROOM, S1) == stamp(20)
    # A new session of the conversation replaces the old one's transcript.
    await store.save_transcript(ROOM, SessionTranscript(S2, b"second", 102.0, stamp(5)))
    assert await store.load_transcript(ROOM, S1) is None
    assert await store.load_transcript(ROOM, S2) == b"second"


async def test_conversations_are_kept_apart(store: InspectableStore) -> None:
    await store.save_transcript(ROOM, SessionTranscript(S1, b"room", 100.0, stamp(1)))
    await store.save_transcript(SLACK_ROOM, SessionTranscript(S1, b"slack", 100.0, stamp(2)))
    await store.save_transcript(THREAD, SessionTranscript(S1, b"thread", 100.0, stamp(3)))
    assert await store.load_transcript(ROOM, S1) == b"room"
    assert await store.load_transcript(SLACK_ROOM, S1) == b"slack"
    assert await store.load_transcript(THREAD, S1) == b"thread"
    assert await store.transcript_stamp(THREAD, S1) == stamp(3)
    await store.drop_transcript(THREAD)
    assert await store.load_transcript(THREAD, S1) is None
    assert await store.load_transcript(ROOM, S1) == b"room"


async def test_a_reset_forgets_the_transcript_with_the_session(store: InspectableStore) -> None:
    await store.set_session(ROOM, S1)
    await store.save_transcript(ROOM, SessionTranscript(S1, b"kept", 100.0, stamp(4)))
    await store.save_transcript(SLACK_ROOM, SessionTranscript(S1, b"other", 100.0, stamp(5)))
    await store.set_session(ROOM, S2)  # another session: the stored one is not its
    assert await store.load_transcript(ROOM, S1) == b"kept"
    await store.set_session(ROOM, None)
    assert await store.load_transcript(ROOM, S1) is None
    assert await store.transcript_stamp(ROOM, S1) is None
    assert await store.load_transcript(SLACK_ROOM, S1) == b"other"
    await store.drop_transcript(ROOM)  # nothing left to drop: fine


async def test_prune_leaves_transcripts_alone(store: InspectableStore) -> None:
    await store.save_transcript(ROOM, SessionTranscript(S1, b"old", 1.0, stamp(3)))
    await store.prune(older_than=1_000_000.0)
    assert await store.load_transcript(ROOM, S1) == b"old"


async def test_concurrent_saves_leave_one_whole_transcript(store: InspectableStore) -> None:
    contents = [bytes([n]) * 1000 for n in range(8)]
    await asyncio.gather(
        *(
            store.save_transcript(ROOM, SessionTranscript(S1, c, 100.0, stamp(n)))
            for n, c in enumerate(contents)
        )
    )
    kept = await store.load_transcript(ROOM, S1)
    found = await store.transcript_stamp(ROOM, S1)
    assert found is not None
    # Content and stamp of the same save, whichever came last.
    assert found == stamp(found.size)
    assert kept == contents[found.size]

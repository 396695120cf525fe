"""Sessions across replicas: a conversation's transcript goes through the database.

Two services in turn on one database, each with its own claude home (two
replicas), run the real claude against the scripted model server: the second
resumes what the first ran. Then :class:`Transcripts` on its own: what it
restores, what it leaves alone, what it refuses.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from bridge.config import load_settings
from bridge.core.model import RoomId, RoomKey, SessionId, TransportName
from bridge.runs.transcripts import (
    TooLarge,
    TranscriptError,
    Transcripts,
    claude_config_dir,
    pack,
    transcript_path,
)
from bridge.service import open_store
from bridge.store.base import SessionTranscript, TranscriptStamp
from bridge.store.memory import MemoryStore
from tests.bridge.harness import ConsoleSession, run_console, write_config
from tests.fakes.model_server import ModelServer, Turn, claude_bin, claude_env

ROOM = RoomKey(TransportName("console"), RoomId("console"))  # the console room
SESSION = SessionId("0b5c1d7e-4a3f-4c2b-9d8e-7f6a5b4c3d2e")
PROJECT = "-srv-work"


def stamp_of(path: Path | None) -> TranscriptStamp:
    assert path is not None
    data = path.read_bytes()
    return TranscriptStamp(len(data), hashlib.sha256(data).hexdigest())


def sessions_under(home: Path) -> list[Path]:
    return sorted((home / ".claude" / "projects").glob("*/*.jsonl"))


@dataclass(frozen=True)
class Served:
    out: str
    prestarts_used: float


async def run_replica(
    tmp_path: Path, server: ModelServer, home: Path, line: str, *, on: bool, prestart: bool
) -> Served:
    """One replica's life: its own claude home, the shared database, one message."""
    runner = {"claude_bin": str(claude_bin()), "transcripts_in_db": on, "prestart": prestart}
    config = write_config(tmp_path, {"runner": runner}, env=claude_env(server.url, home))
    async with ConsoleSession(load_settings(config)) as bridge:
        bridge.send(line)
        out = await bridge.finish()
        assert bridge.service is not None
        used = bridge.service.parts.metrics.prestarts.labels("used", "")._value.get()
    return Served(out, used)


@pytest.mark.slow
@pytest.mark.claude
@pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed")
@pytest.mark.parametrize(
    ("in_db", "prestart"),
    [(True, False), (True, True), (False, False)],
    # A prestart spawns claude with --resume before its batch is complete: restored first.
    ids=["transcripts_in_db", "prestarted", "off"],
)
async def test_a_conversation_resumes_on_another_replica(
    tmp_path: Path, in_db: bool, prestart: bool
) -> None:
    home_a, home_b = tmp_path / "replica-a", tmp_path / "replica-b"
    script = [Turn(text="The secret word is noted."), Turn(text="You said pineapple.")]
    async with ModelServer(script, default=Turn(text="I have no idea.")) as server:
        first = "The word is pineapple."
        a = await run_replica(tmp_path, server, home_a, first, on=in_db, prestart=prestart)
        assert "The secret word is noted." in a.out
        [saved] = sessions_under(home_a)
        assert sessions_under(home_b) == []

        second = "What was the word?"
        b = await run_replica(tmp_path, server, home_b, second, on=in_db, prestart=prestart)
        asked = "\n".join(server.agent_requests[-1].texts())

    if not in_db:
        # The control: without the database the other replica has no such session.
        assert "no longer has session" in b.out
        assert "pineapple" not in asked
        return
    assert "no longer has session" not in b.out
    assert "You said pineapple." in b.out
    assert b.prestarts_used == (1 if prestart else 0)
    assert "The word is pineapple." in asked  # claude replayed the first run's turn
    [restored] = sessions_under(home_b)
    assert restored.relative_to(home_b) == saved.relative_to(home_a)
    assert stat.S_IMODE(restored.stat().st_mode) == 0o600
    # The second run appended to the restored copy: the first run's lines come first.
    assert restored.read_bytes().startswith(saved.read_bytes())


@pytest.mark.slow
@pytest.mark.claude
@pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed")
async def test_a_conversation_back_on_its_first_replica_resumes_the_latest_turns(
    tmp_path: Path,
) -> None:
    """A, then B, then A again: A's own copy lacks B's turn and is replaced."""
    home_a, home_b = tmp_path / "replica-a", tmp_path / "replica-b"
    script = [Turn(text="One."), Turn(text="Two."), Turn(text="Three.")]
    async with ModelServer(script) as server:
        for home, line in ((home_a, "apple"), (home_b, "banana"), (home_a, "cherry")):
            served = await run_replica(tmp_path, server, home, line, on=True, prestart=False)
            assert "no longer has session" not in served.out
        asked = "\n".join(server.agent_requests[-1].texts())
    assert "Three." in served.out
    for earlier in ("apple", "One.", "banana", "Two.", "cherry"):
        assert earlier in asked
    [a] = sessions_under(home_a)
    [b] = sessions_under(home_b)
    assert a.read_bytes().startswith(b.read_bytes())


@pytest.mark.slow
@pytest.mark.claude
@pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed")
async def test_a_reset_leaves_no_transcript_in_the_database(tmp_path: Path) -> None:
    home = tmp_path / "replica-a"
    async with ModelServer([Turn(text="Noted.")]) as server:
        a = await run_replica(
            tmp_path, server, home, "The word is pineapple.", on=True, prestart=False
        )
        assert "Noted." in a.out
        [saved] = sessions_under(home)
        session = SessionId(saved.stem)
        settings = load_settings(tmp_path / "chatbridge.toml")
        store = await open_store(settings)
        try:
            assert await store.get_session(ROOM) == session
            assert await store.transcript_stamp(ROOM, session) == stamp_of(saved)
        finally:
            await store.close()
        await run_console(settings, ["!reset"])
    store = await open_store(settings)
    try:
        assert await store.get_session(ROOM) is None
        assert await store.load_transcript(ROOM, session) is None
    finally:
        await store.close()


def write_session(config_dir: Path, text: bytes, side: bytes | None = None) -> Path:
    path = config_dir / "projects" / PROJECT / f"{SESSION}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text)
    if side is not None:
        result = path.parent / SESSION / "tool-results" / "r1.txt"
        result.parent.mkdir(parents=True)
        result.write_bytes(side)
    return path


def transcripts(store: MemoryStore, max_bytes: int = 1 << 20) -> Transcripts:
    return Transcripts(store, max_bytes, wall_clock=lambda: 1000.0, base_env={})


async def test_the_session_and_its_side_files_are_restored_where_missing(tmp_path: Path) -> None:
    store = MemoryStore()
    a, b = tmp_path / "a", tmp_path / "b"
    write_session(a, b'{"turn": 1}\n', side=b"a large tool result")
    assert await transcripts(store).save_after(ROOM, SESSION, a)
    assert await store.transcript_stamp(ROOM, SESSION) == stamp_of(transcript_path(a, SESSION))

    assert await transcripts(store).restore_before(ROOM, SESSION, b)
    restored = transcript_path(b, SESSION)
    assert restored == b / "projects" / PROJECT / f"{SESSION}.jsonl"
    assert restored.read_bytes() == b'{"turn": 1}\n'
    side = b / "projects" / PROJECT / SESSION / "tool-results" / "r1.txt"
    assert side.read_bytes() == b"a large tool result"
    assert [p.name for p in restored.parent.iterdir() if p.name.endswith(".tmp")] == []
    # Current now: nothing to write again.
    assert not await transcripts(store).restore_before(ROOM, SESSION, b)


async def test_an_older_copy_is_replaced_and_a_newer_one_kept(tmp_path: Path) -> None:
    store = MemoryStore()
    a, b = tmp_path / "a", tmp_path / "b"
    write_session(a, b"1\n2\n")
    await transcripts(store).save_after(ROOM, SESSION, a)
    older = write_session(b, b"1\n")
    assert await transcripts(store).restore_before(ROOM, SESSION, b)
    assert older.read_bytes() == b"1\n2\n"
    # This host ran a turn whose save did not land: its copy is the newer one.
    newer = write_session(b, b"1\n2\n3\n")
    assert not await transcripts(store).restore_before(ROOM, SESSION, b)
    assert newer.read_bytes() == b"1\n2\n3\n"


async def test_a_copy_of_the_same_length_but_other_turns_is_replaced(tmp_path: Path) -> None:
    """A replica that died mid-run left a turn nobody saved; another replica ran the
    conversation on from the stored copy since. The stored copy wins, even where this
    host's is as long or longer."""
    store = MemoryStore()
    a, b = tmp_path / "a", tmp_path / "b"
    write_session(a, b"1\n2\n")
    await transcripts(store).save_after(ROOM, SESSION, a)
    for other in (b"1\nX\n", b"1\nXXXXXX\n"):
        mine = write_session(b, other)
        assert await transcripts(store).restore_before(ROOM, SESSION, b)
        assert mine.read_bytes() == b"1\n2\n"


async def test_another_sessions_transcript_is_not_restored(tmp_path: Path) -> None:
    store = MemoryStore()
    write_session(tmp_path / "a", b"x\n")
    await transcripts(store).save_after(ROOM, SESSION, tmp_path / "a")
    other = SessionId("11111111-2222-3333-4444-555555555555")
    assert not await transcripts(store).restore_before(ROOM, other, tmp_path / "b")
    assert not (tmp_path / "b").exists()


async def test_a_transcript_over_the_cap_is_not_saved_and_the_old_one_goes(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    write_session(tmp_path, b"small\n")
    assert await transcripts(store).save_after(ROOM, SESSION, tmp_path)
    # Random bytes do not compress: well over a 4 KiB cap.
    write_session(tmp_path, os.urandom(16384) + b"\n")
    assert not await transcripts(store, max_bytes=4096).save_after(ROOM, SESSION, tmp_path)
    assert await store.transcript_stamp(ROOM, SESSION) is None


def test_packing_stops_at_the_cap(tmp_path: Path) -> None:
    path = write_session(tmp_path, os.urandom(1 << 20))
    with pytest.raises(TooLarge):
        pack(tmp_path, SESSION, max_bytes=64 * 1024)
    packed = pack(tmp_path, SESSION, max_bytes=2 << 20)
    assert packed is not None
    assert packed[1] == stamp_of(path)


async def test_nothing_to_save_without_the_file(tmp_path: Path) -> None:
    store = MemoryStore()
    assert not await transcripts(store).save_after(ROOM, SESSION, tmp_path)
    assert pack(tmp_path, SESSION) is None


@pytest.mark.parametrize(
    "name",
    [
        f"../{SESSION}.jsonl",
        f"{PROJECT}/../../evil/{SESSION}.jsonl",
        f"/etc/{SESSION}.jsonl",
        f"{PROJECT}/other.jsonl",
        f"{PROJECT}/not-the-session/x.txt",
        f"{SESSION}.jsonl",
    ],
)
async def test_a_stored_entry_outside_the_session_is_refused(tmp_path: Path, name: str) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"x\n"))
    store = MemoryStore()
    await store.save_transcript(
        ROOM, SessionTranscript(SESSION, buffer.getvalue(), 1.0, TranscriptStamp(2, ""))
    )
    with pytest.raises(TranscriptError):
        await transcripts(store).restore_before(ROOM, SESSION, tmp_path / "home")
    assert not (tmp_path / "evil").exists()
    assert list(tmp_path.rglob("*.jsonl")) == []


def test_the_config_dir_is_claudes() -> None:
    cwd = Path("/srv/work")
    assert claude_config_dir({"HOME": "/h"}, cwd) == Path("/h/.claude")
    assert claude_config_dir({"HOME": "/h", "CLAUDE_CONFIG_DIR": "/c"}, cwd) == Path("/c")
    assert claude_config_dir({"CLAUDE_CONFIG_DIR": "rel"}, cwd) == Path("/srv/work/rel")
    assert claude_config_dir({}, cwd) is None

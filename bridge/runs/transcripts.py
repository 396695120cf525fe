"""Claude session transcripts in the database: a conversation resumes on any replica.

:meth:`Transcripts.save_after` packs a session's files under claude's config directory
(tar, gzip, off the event loop) into the conversation's ``session_transcripts`` row after a
run that kept it; :meth:`Transcripts.restore_before` writes them back before a resume unless
this host's copy is that version or a later one of it (:class:`TranscriptStamp`: size and
SHA-256 of the prefix) (docs/replicas-sessions.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from bridge.core.model import RoomKey, SessionId
from bridge.core.private import private_dirs
from bridge.store.base import SessionTranscript, TranscriptStamp, TranscriptStore

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

log = logging.getLogger(__name__)

PROJECTS = "projects"
"""claude's directory of sessions, one subdirectory per working directory."""
TRANSCRIPT_SUFFIX = ".jsonl"
COMPRESS_LEVEL = 1
"""Measured on claude's transcripts: 3.3:1 at about 7.5 ms per MB, where zlib's default
(6) gives 3.9:1 at 30 ms per MB. Every run saves; the room waits for it."""


class TranscriptError(Exception):
    """A stored transcript that cannot be written back (not what :func:`pack` makes)."""


def claude_config_dir(env: Mapping[str, str], cwd: Path) -> Path | None:
    """Where claude started with ``env`` in ``cwd`` keeps its sessions' directory
    ``projects``; None when the environment names no home for it."""
    configured = env.get("CLAUDE_CONFIG_DIR")
    if configured:
        path = Path(configured)
    elif env.get("HOME"):
        path = Path(env["HOME"]) / ".claude"
    else:
        return None
    # A relative directory is relative to claude's own working directory.
    return path if path.is_absolute() else cwd / path


def transcript_path(config_dir: Path, session_id: SessionId) -> Path | None:
    """This host's transcript of ``session_id`` (session ids are UUIDs: one at most)."""
    found = [p for p in (config_dir / PROJECTS).glob(f"*/{session_id}{TRANSCRIPT_SUFFIX}")]
    if not found:
        return None
    # The same session in two working directories: the one claude wrote last.
    return max(found, key=lambda p: p.stat().st_mtime_ns)


class TooLarge(Exception):
    """The packed session grew past the cap (:func:`pack` stops there)."""


class _CappedBuffer(io.BytesIO):
    """The packed bytes, refusing to grow past ``cap``: a transcript that is not to be
    saved costs compressing at most ``cap`` bytes of it, not all of it."""

    def __init__(self, cap: int | None) -> None:
        super().__init__()
        self._cap = cap

    def write(self, data: ReadableBuffer) -> int:
        if self._cap is not None and self.tell() + memoryview(data).nbytes > self._cap:
            raise TooLarge
        return super().write(data)


def pack(
    config_dir: Path, session_id: SessionId, max_bytes: int | None = None
) -> tuple[bytes, TranscriptStamp] | None:
    """The session's files as a gzipped tar (paths relative to ``projects``), and the
    transcript's stamp; None if this host has no transcript of it. Blocking.

    Raises :class:`TooLarge` as soon as the result would pass ``max_bytes``.
    """
    transcript = transcript_path(config_dir, session_id)
    if transcript is None:
        return None
    projects = config_dir / PROJECTS
    side = transcript.with_suffix("")
    files = [p for p in sorted(side.rglob("*")) if p.is_file() and not p.is_symlink()]
    buffer = _CappedBuffer(max_bytes)
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=COMPRESS_LEVEL) as tar:
        for path in files:
            _add(tar, projects, path)
        # The transcript last: a restore writes it last, so its presence means
        # everything it points at is there.
        stamp = _add(tar, projects, transcript)
    return buffer.getvalue(), stamp


class _Hashing:
    """A file read through, hashed on the way (tarfile reads it in chunks)."""

    def __init__(self, source: io.BufferedReader) -> None:
        self._source = source
        self.sha256 = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._source.read(size)
        self.sha256.update(data)
        return data


def _add(tar: tarfile.TarFile, projects: Path, path: Path) -> TranscriptStamp:
    """Add ``path`` as it is now (read from one open file, streamed); its stamp."""
    with path.open("rb") as source:
        info = tarfile.TarInfo(path.relative_to(projects).as_posix())
        # The size of the file opened: what is packed, and what is stored as its size.
        info.size = os.fstat(source.fileno()).st_size
        info.mode = 0o600
        hashing = _Hashing(source)
        tar.addfile(info, hashing)
        return TranscriptStamp(info.size, hashing.sha256.hexdigest())


def unpack(config_dir: Path, session_id: SessionId, content: bytes) -> Path:
    """Write the session's files from ``content`` (made by :func:`pack`) under
    ``config_dir``, each atomically, the transcript last; its path. Blocking."""
    projects = config_dir / PROJECTS
    written: Path | None = None
    with tarfile.open(fileobj=io.BytesIO(content), mode="r:gz") as tar:
        members = tar.getmembers()
        for member in members:
            _check_member(member, session_id)
        project = {PurePosixPath(m.name).parts[0] for m in members}
        if len(project) != 1:
            raise TranscriptError("a stored transcript spans several project directories")
        for member in members:
            source = tar.extractfile(member)
            if source is None:
                raise TranscriptError(f"no content for {member.name!r}")
            target = projects.joinpath(*PurePosixPath(member.name).parts)
            write_atomically(target, source.read())
            written = target
    if written is None or written.name != f"{session_id}{TRANSCRIPT_SUFFIX}":
        raise TranscriptError("a stored transcript without its transcript file last")
    return written


def _check_member(member: tarfile.TarInfo, session_id: SessionId) -> None:
    """Only ``<project>/<session>.jsonl`` and files under ``<project>/<session>/``:
    nothing a stored row holds may land anywhere else."""
    parts = PurePosixPath(member.name).parts
    inside = (
        member.isfile()
        and len(parts) >= 2
        and not PurePosixPath(member.name).is_absolute()
        and all(p not in ("", ".", "..") for p in parts)
        and (
            (len(parts) == 2 and parts[1] == f"{session_id}{TRANSCRIPT_SUFFIX}")
            or (len(parts) > 2 and parts[1] == session_id)
        )
    )
    if not inside:
        raise TranscriptError(f"unexpected entry {member.name!r} in a stored transcript")


def write_atomically(target: Path, data: bytes) -> None:
    """``target`` holds ``data`` whole or is as it was: a temporary file (mode 0600,
    as claude makes its session files) beside it, synced, renamed over it; the
    directories it needs are made 0700."""
    # Directories private, as the file: they are named after the room's directory.
    private_dirs(target.parent)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def holds(config_dir: Path, session_id: SessionId, stamp: TranscriptStamp) -> int | None:
    """How many bytes this host's transcript of ``session_id`` has past the version
    ``stamp`` tells (0: it is that version); None when it is not that version or a
    later one of it (missing, shorter, or other bytes). Blocking."""
    path = transcript_path(config_dir, session_id)
    if path is None:
        return None
    with path.open("rb") as local:
        size = os.fstat(local.fileno()).st_size
        if size < stamp.size:
            return None
        digest = hashlib.sha256()
        left = stamp.size
        while left:
            chunk = local.read(min(left, 1 << 20))
            if not chunk:
                return None  # cut short while being read
            digest.update(chunk)
            left -= len(chunk)
    return size - stamp.size if digest.hexdigest() == stamp.digest else None


@dataclass(slots=True)
class Transcripts:
    """Saves a conversation's session transcript after a run, restores it before one."""

    store: TranscriptStore
    max_bytes: int
    """A transcript larger than this, compressed, is not saved (see :meth:`save_after`)."""
    wall_clock: Callable[[], float] = time.time
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    """The environment claude inherits (a room's ``env`` goes over it)."""

    def config_dir(self, room_env: Mapping[str, str], cwd: Path) -> Path | None:
        """claude's config directory for a run of a room with ``room_env`` in ``cwd``."""
        return claude_config_dir({**self.base_env, **room_env}, cwd)

    async def save_after(self, room: RoomKey, session_id: SessionId, config_dir: Path) -> bool:
        """Store the session's files as the conversation's transcript; whether it was.

        Too large (compressed, over ``max_bytes``): not saved, and the stored one
        (an older copy, or another session's) dropped, so another replica
        starts a fresh session rather than resume an outdated one.
        """
        try:
            packed = await asyncio.to_thread(pack, config_dir, session_id, self.max_bytes)
        except TooLarge:
            log.warning(
                "the transcript of session %s is over [runner] transcript_max_bytes (%d"
                " bytes compressed): not saved; another replica would start a fresh session",
                session_id,
                self.max_bytes,
            )
            await self.store.drop_transcript(room)
            return False
        if packed is None:
            log.warning("no transcript of session %s under %s to save", session_id, config_dir)
            return False
        content, stamp = packed
        await self.store.save_transcript(
            room, SessionTranscript(session_id, content, self.wall_clock(), stamp)
        )
        log.debug("saved the transcript of session %s (%d bytes)", session_id, len(content))
        return True

    async def restore_before(self, room: RoomKey, session_id: SessionId, config_dir: Path) -> bool:
        """Write the stored transcript of ``session_id`` under ``config_dir`` unless this
        host's copy is that version or a later one of it; whether it did."""
        stamp = await self.store.transcript_stamp(room, session_id)
        if stamp is None:
            return False  # nothing stored: claude resumes what this host has, if anything
        ahead = await asyncio.to_thread(holds, config_dir, session_id, stamp)
        if ahead is not None:
            if ahead:
                # This host ran later turns whose save did not land: its copy is newer.
                log.info("this host's transcript of session %s is newer; kept", session_id)
            return False
        content = await self.store.load_transcript(room, session_id)
        if content is None:
            return False  # replaced or dropped meanwhile
        path = await asyncio.to_thread(unpack, config_dir, session_id, content)
        log.info("restored the transcript of session %s to %s", session_id, path)
        return True

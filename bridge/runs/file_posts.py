"""Files claude posts to the room with the ``chatbridge`` MCP tool ``send_file``.

From claude's stream-json (a ``tool_use`` of ``mcp__chatbridge__send_file`` and its successful
result), the bridge checks the path again by the same rule, copies the file into its state
directory and records the post in the outbox, exactly once per tool use (:func:`post_key`,
``Store.enqueue_once``; a refusal is recorded under the same key as a notice)
(docs/files.md, "How the file reaches the room").
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from bridge.config import RoomSettings
from bridge.core.model import Batch, Reply, ReplyKind, RunId
from bridge.core.private import FILE_MODE, private_dirs
from bridge.metrics import Metrics
from bridge.outbound.outbox import Outbox
from bridge.outbound.replies import in_conversation
from bridge.store.base import OutboxEntry, OutboxStore, StoreError
from runner.events import RunEvent, ToolResult, ToolUse
from runner.mcp_server import QUALIFIED_TOOL, NotSendable, check_sendable

log = logging.getLogger(__name__)

FILES_DIR = "files"
"""Under ``[runner] state_dir``: the copies of files waiting to be posted."""
COPY_CHUNK = 1024 * 1024
RECORD_RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 4.0)


def send_file_rules(room: RoomSettings) -> tuple[str, ...]:
    """The allowed-tools rule that lets runs of ``room`` post files without asking."""
    if room.send_files and not room.send_files_need_approval:
        return (QUALIFIED_TOOL,)
    return ()


def post_key(run_id: RunId, tool_use_id: str) -> str:
    """The outbox key of the post one tool use asked for: the same on every replay."""
    digest = hashlib.sha256(f"{run_id}\0{tool_use_id}".encode()).hexdigest()
    return f"cbf-{digest[:40]}"


def _open_beneath(root: Path, source: Path) -> int:
    """Open ``source`` (a resolved path under the resolved ``root``) one part at a
    time from ``root``, following no link on the way: a directory swapped for a
    link after the check cannot lead outside ``root``."""
    *dirs, name = source.relative_to(root).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in dirs:
            inner = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = inner
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def copy_file(root: Path, source: Path, into: Path, max_bytes: int) -> Path:
    """Copy ``source`` (checked, resolved, under the resolved ``root``) to
    ``into/<its name>``, atomically; the copy.

    Opened from ``root`` without following a link on the way, and checked
    again on the open file: a file or a directory swapped for a link, or a
    file for a device, after the check is not read, and a file grown past the
    limit since is refused (NotSendable).
    """
    try:
        fd = _open_beneath(root, source)
    except (OSError, ValueError) as exc:
        linked = isinstance(exc, OSError) and exc.errno in (errno.ELOOP, errno.ENOTDIR)
        why = "a link now" if linked else "cannot be read"
        raise NotSendable(f"{source.name}: {why}") from exc
    partial = into.with_name(into.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with os.fdopen(fd, "rb") as reader:
            _copy_open(reader, partial / source.name, max_bytes)
        partial.rename(into)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return into / source.name


def _copy_open(reader: BinaryIO, target: Path, max_bytes: int) -> None:
    if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
        raise NotSendable(f"{target.name}: not a regular file")
    private_dirs(target.parent)
    copied = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(target, flags, FILE_MODE), "wb") as writer:
        while chunk := reader.read(COPY_CHUNK):
            copied += len(chunk)
            if copied > max_bytes:
                raise NotSendable(f"{target.name}: over the limit of {max_bytes} bytes")
            writer.write(chunk)
        writer.flush()
        os.fsync(writer.fileno())


def prepare_copy(into: Path, cwd: Path, path: object, max_bytes: int) -> tuple[Path, bool]:
    """The copy to post, and whether it was made now (False: an earlier attempt, before
    a crash, made it). Checks ``path`` by the MCP server's rule first; raises NotSendable."""
    if into.is_dir():
        earlier = next((p for p in into.iterdir() if p.is_file()), None)
        if earlier is not None:
            return earlier, False
    if not isinstance(path, str):
        raise NotSendable("no path given")
    sendable = check_sendable(cwd, path, max_bytes)
    return copy_file(cwd.resolve(), sendable.path, into, max_bytes), True


@dataclass(slots=True)
class FilePosts:
    """Turns a run's ``send_file`` uses into outbox entries."""

    store: OutboxStore
    outbox: Outbox
    metrics: Metrics
    state_dir: Path
    wall_clock: Callable[[], float] = time.time

    def watch(self, run_id: RunId, batch: Batch, room: RoomSettings) -> RunFiles:
        """What follows one run's events (a fresh one per run, or per reattach)."""
        return RunFiles(self, run_id, batch, room)

    async def post(self, run_id: RunId, batch: Batch, room: RoomSettings, use: ToolUse) -> None:
        """Check, copy and record the post ``use`` asked for, then hand it to the outbox.

        Never raises (but cancellation): it runs beside the run, which must end whatever
        happens here."""
        try:
            await self._post(run_id, batch, room, use)
        except Exception:
            log.exception("posting a file claude sent failed inside chatbridge")

    async def _post(self, run_id: RunId, batch: Batch, room: RoomSettings, use: ToolUse) -> None:
        path = use.input.get("path")
        comment = use.input.get("comment")
        comment = comment if isinstance(comment, str) else ""
        key = post_key(run_id, use.id)
        into = (self.state_dir / FILES_DIR / key).absolute()
        try:
            copy, made = await asyncio.to_thread(
                prepare_copy, into, room.cwd, path, room.max_send_file_bytes
            )
        except (NotSendable, OSError) as exc:
            if isinstance(exc, NotSendable):
                log.warning("send_file refused by the bridge: %s", exc)
                why = str(exc)
            else:  # the state directory: full, not writable
                log.error("could not copy a file claude sent: %s", exc)
                why = "chatbridge could not copy it (see its log)"
            self.metrics.files_sent.labels("refused").inc()
            notice = in_conversation(batch, f"Could not send a file: {why}", ReplyKind.NOTICE)
            self.outbox.submit(await self._record(notice, key))
            return
        reply = replace(in_conversation(batch, comment, ReplyKind.RESULT), file=str(copy))
        entries = await self._record(reply, key)
        if not entries and made:
            # Recorded (and posted, its copy gone) before a restart: this copy is spare.
            await asyncio.to_thread(shutil.rmtree, into, ignore_errors=True)
        if entries:
            self.metrics.files_sent.labels("queued").inc()
            log.info("file %s queued for the room", copy.name)
        self.outbox.submit(entries)

    async def post_text(
        self, run_id: RunId, batch: Batch, tag: str, *, name: str, text: str, comment: str
    ) -> None:
        """Post ``text`` as a file ``name`` in ``batch``'s conversation, once per run and
        ``tag`` (a run's diff): written privately under the state directory, recorded,
        handed to the outbox, which removes it once posted. Never raises (but
        cancellation)."""
        key = post_key(run_id, tag)
        into = (self.state_dir / FILES_DIR / key).absolute()
        try:
            path = await asyncio.to_thread(_write_private, into / name, text)
            reply = replace(in_conversation(batch, comment, ReplyKind.RESULT), file=str(path))
            entries = await self._record(reply, key)
            if entries:
                self.metrics.files_sent.labels("queued").inc()
            self.outbox.submit(entries)
        except Exception:
            log.exception("could not post %s to the room", name)

    async def _record(self, reply: Reply, key: str) -> list[OutboxEntry]:
        """``enqueue_once``, tried again while the store fails (safe: keyed)."""
        for delay in (*RECORD_RETRY_DELAYS_S, None):
            try:
                return await self.store.enqueue_once(reply, key, self.wall_clock())
            except StoreError:
                if delay is None:
                    # The copy stays; a reattach after a restart would try again.
                    log.error("could not record a file post; it is not sent")
                    return []
                await asyncio.sleep(delay)
        return []


@dataclass(slots=True)
class RunFiles:
    """One run's ``send_file`` tool uses, waiting for their results."""

    posts: FilePosts
    run_id: RunId
    batch: Batch
    room: RoomSettings
    asked: dict[str, ToolUse] = field(default_factory=dict)

    def see(self, event: RunEvent) -> Coroutine[Any, Any, None] | None:
        """The post to make for ``event``, if it is a successful ``send_file`` result."""
        match event:
            case ToolUse(name=name, id=use_id) if name == QUALIFIED_TOOL:
                self.asked[use_id] = event
            case ToolResult(tool_use_id=use_id, is_error=is_error) if use_id in self.asked:
                use = self.asked.pop(use_id)
                if not is_error:
                    return self.posts.post(self.run_id, self.batch, self.room, use)
            case _:
                pass
        return None


def _write_private(path: Path, text: str) -> Path:
    """``text`` into ``path`` (its folder 0700, the file 0600, whatever the umask)."""
    private_dirs(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
        f.write(text)
    return path

"""The bridge's side of a run's supervisor (``runner/supervisor.py``): a client of its socket.

Starts the supervisor detached (``subprocess.Popen``, a session of its own, a socketpair end
as its first connection) and reads the run's journal from offset 0 with one reader,
:class:`Supervised`, whether the run is new, reattached or over. Only the ``done`` record ends
a run: an earlier end of the connection means attach again once, or wait and read the file.
Closing without ``stop`` is a detach (docs/detached-runs.md, "The socket" and "The bridge's side").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.core import stages
from bridge.core.aio import shielded
from bridge.core.model import LiveRun, RunId
from runner import protocol
from runner.bare import bare_argv
from runner.journal import JOURNAL, SOCK
from runner.process import has_exited, kill_cgroup, kill_marked, kill_tree, wait_exited
from runner.protocol import Malformed, Refused, parse_header
from runner.request import RunRequest
from runner.spare import SUPERVISOR, Spares
from runner.supervisor import DONE_LINGER_S, KILL_DEADLINE_S

log = logging.getLogger(__name__)

PROTOCOL_VERSIONS = protocol.PROTOCOL_VERSIONS
"""The journal and socket protocol versions this bridge reads (docs/detached-runs.md)."""

SUPERVISOR_KILL_S = KILL_DEADLINE_S + 1.0
"""The supervisor's own bound after its grace period, plus slack."""
CLOSE_S = 1.0
"""After the connection ended: how long the supervisor may take to exit (to be reaped)."""
FINISH_S = DONE_LINGER_S + 1.0
"""A supervisor that no longer accepts connections is finishing: how long it may take."""
WELCOME_S = 10.0
"""How long a supervisor may take to answer an ``attach`` (its ``welcome``) and, at a start,
to journal that claude runs (``spawned``). It answers from its event loop at once (a
start takes milliseconds); one that does not within this is frozen (SIGSTOP) or stuck, and
waiting on would hang the room: the bridge stops the run itself instead."""


@dataclass(frozen=True)
class RunLimits:
    """Where the run's cgroup goes and what it may use; an empty parent means no cgroup."""

    cgroup_parent: str = ""
    memory_max: int | None = None
    pids_max: int | None = None


class SpawnFailed(Exception):
    """The supervisor could not start claude; ``errno`` is the OSError's, if any."""

    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno


class Unanswered(Exception):
    """The supervisor did not answer within :data:`WELCOME_S`; the bridge stopped the run."""


@dataclass(frozen=True, slots=True)
class Record:
    """One journal record: ``kind`` is its ``t``; ``end`` the journal offset just past it."""

    kind: str
    fields: dict[str, Any]
    payload: bytes
    end: int


class Supervised:
    """A run's supervisor as the bridge sees it: its journal, read in order, and its processes.

    ``writer`` is None for a journal read from its file (the supervisor is
    gone); ``proc`` is set when the supervisor is our child (to be reaped).
    Every record goes through :meth:`read`, which also keeps what the stop
    needs to know: claude's exit, the ``done`` record, the run's cgroup.
    """

    def __init__(
        self,
        run_id: RunId,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter | None,
        *,
        live: LiveRun,
        offset: int = 0,
        proc: subprocess.Popen[bytes] | None = None,
        pidfd: int | None = None,
    ) -> None:
        self.run_id = run_id
        self.live = live
        self.claude_pid = live.claude_pid
        self._reader = reader
        self._writer = writer
        self._offset = offset
        self._proc = proc
        self._pidfd = pidfd
        """Pins the supervisor: after its death this still names it, never a recycled pid."""
        self._reattached = False
        self._stop_asked = False
        self.deadline: float | None = None
        """(Loop time) how long to wait at most for a supervisor whose connection ended early."""
        self._claude_fd: int | None = None
        self.cgroup: str | None = None
        """The run's cgroup v2 group, if it has one (from the ``spawned`` record)."""
        self.unwritable_at_start: Record | None = None
        """The journal's ``unwritable``, when the start read it (a disk full from the
        run's first record on): the reader of the records after ``spawned`` is told."""
        loop = asyncio.get_running_loop()
        self.claude_exit: asyncio.Future[int] = loop.create_future()
        """claude's return code (negative for a signal), once it exited."""
        self.survivors: list[int] | None = None
        """Pids that survived SIGKILL, from the supervisor's ``done`` (None: no such record)."""
        self.gone: asyncio.Future[None] = loop.create_future()
        """Done once the journal ended: after ``done``, or because the supervisor died."""
        self.detached = False
        self.version = 1
        """The run's protocol version (its journal's ``hello``); 2: streaming input."""
        self._unread: list[Record] = []
        self.history_end = 0
        """The journal's length when we attached: records before it are history, whose
        state a restarted bridge rebuilds before it acts on it (the end rule)."""

    @property
    def contained(self) -> bool:
        """The supervisor said it stopped the whole run (its ``done`` record)."""
        return self.survivors is not None

    async def read(self) -> Record | None:
        """The next record, or None once the journal ended.

        The journal ends after ``done``; at a malformed record (it is
        unreadable from there); or where its file ends. A connection that
        ends or breaks before ``done`` does not end it (see :meth:`_resume`).
        """
        if self._unread:
            return self._unread.pop(0)
        while not self.gone.done():
            try:
                record = await self._next()
            except Malformed as exc:
                log.error("run %s: journal unreadable at %d: %s", self.run_id, self._offset, exc)
                break
            if record is not None:
                return record
            if self.survivors is not None or not await self._resume():
                break
        if not self.gone.done():
            self.gone.set_result(None)
        return None

    async def _next(self) -> Record | None:
        """The next record from the current source; None where it ends or breaks."""
        try:
            line = await self._reader.readuntil(b"\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            return None
        fields = parse_header(line)
        n = fields.get("n", 0)
        try:
            payload = await self._reader.readexactly(n) if n else b""
        except (asyncio.IncompleteReadError, OSError):
            return None  # a torn last record: read again from its start
        self._offset += len(line) + len(payload)
        record = Record(fields["t"], fields, payload, self._offset)
        self._note(record)
        return record

    async def _resume(self) -> bool:
        """The connection ended before ``done``: whether the journal goes on from another source.

        The supervisor may well have finished (it closed with part of the
        prompt unread, or a slow bridge outlasted its linger), or our
        connection was taken over by another ``attach``: neither is its
        death. So, never killing a live supervisor for it: one still alive is
        attached to again, once, from the offset read so far; else it is
        given until :attr:`deadline` to exit; then the rest of the journal
        comes from its file. The file's end is the journal's end.
        """
        if self._writer is None:
            return False  # the file (or a replay) already
        await self._drop_connection()
        pidfd = self._pidfd
        if pidfd is not None and not has_exited(pidfd):
            if not self._reattached:
                self._reattached = True
                if await self._reattach():
                    return True
            loop = asyncio.get_running_loop()
            within = FINISH_S if self.deadline is None else max(0.0, self.deadline - loop.time())
            await wait_exited([pidfd], within)
        reader = journal_from(self.live.run_dir, self._offset)
        if reader is None:
            return False
        log.info("run %s: reading its journal's file from %d", self.run_id, self._offset)
        self._reader = reader
        return True

    async def _reattach(self) -> bool:
        """Attach again from the offset read so far; whether the supervisor took us."""
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(WELCOME_S):
                sock = await _connect(self.live.run_dir)
                if sock is None:
                    return False
                reader, writer = await asyncio.open_unix_connection(sock=sock)
                writer.write(_attach(self._offset))
                welcome = await _welcome(reader)
        except (TimeoutError, Refused, OSError):
            welcome = None
        if welcome is None or writer is None:
            if writer is not None:
                writer.close()
            return False
        log.info("run %s: connection ended early; attached again at %d", self.run_id, self._offset)
        self._reader, self._writer = reader, writer
        if self._stop_asked:
            writer.write(protocol.STOP)  # the one asked on the lost connection may not have arrived
        return True

    async def _drop_connection(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def _note(self, record: Record) -> None:
        match record.kind:
            case "hello" if self._writer is None and protocol.version_of(record.fields):
                self.version = record.fields["v"]  # a journal's file: attached, welcome told
            case "spawned":
                self.cgroup = record.fields.get("cgroup") or None
                if self._pidfd is not None and self._claude_fd is None:
                    self._claude_fd = _pin(self.claude_pid, parent=self.live.supervisor_pid)
            case "exited" if not self.claude_exit.done():
                self.claude_exit.set_result(record.fields["code"])
            case "done":
                self.survivors = list(record.fields["survivors"])

    def unread(self, records: list[Record]) -> None:
        """Hand records read already (by a prestart's wait) back to the next reader."""
        self._unread = [*records, *self._unread]

    def send(self, data: bytes) -> bool:
        """Send records to the supervisor; False once it is gone or we detached."""
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)
            return True
        return False

    def write_stdin(self, lines: bytes) -> bool:
        """Whole lines for claude's stdin; False if they cannot be sent (no connection)."""
        return self.send(protocol.stdin(lines))

    def close_stdin(self) -> None:
        """``eof``: claude's stdin is closed once what was sent before is written."""
        self.send(protocol.EOF)

    async def drain(self) -> None:
        if self._writer is not None and not self._writer.is_closing():
            with contextlib.suppress(ConnectionError):
                await self._writer.drain()

    def stop(self) -> None:
        """Ask the supervisor to stop the run (TERM, grace, KILL); idempotent.

        Without a connection (it broke: the supervisor is waited for), a
        SIGTERM asks the same. A supervisor that is gone cannot: :meth:`wait`
        then returns at once and :attr:`contained` tells that :meth:`contain`
        has to.
        """
        self._stop_asked = True
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(protocol.STOP)
        elif self._pidfd is not None and not has_exited(self._pidfd):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGTERM)

    async def wait(self, within: float) -> bool:
        """Wait up to ``within`` s for the journal's end; whether it came."""
        await asyncio.wait({self.gone}, timeout=within)
        return self.gone.done()

    async def contain(self) -> int:
        """Stop the run without its supervisor; return how many processes were killed.

        For a supervisor that died (SIGKILL, the OOM killer) or did not finish
        in time (stopped, stuck), or whose journal ends without ``done``:
        first, while it is alive, its whole tree (see :func:`kill_tree`); then
        the run's cgroup; claude by its pidfd; and the marker sweep for
        whatever left the tree before. The /proc scans of the tree and the
        sweep run in a worker thread, off the event loop.
        """
        killed = 0
        if self._pidfd is not None:
            killed += await kill_tree(self._pidfd, self.live.supervisor_pid)
        if self.cgroup is not None:
            killed += await kill_cgroup(self.cgroup)
        if self._claude_fd is not None and not has_exited(self._claude_fd):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._claude_fd, signal.SIGKILL)
                killed += 1
        killed += await kill_marked(self.run_id, grace_s=0)
        if self._pidfd is not None:
            await wait_exited([self._pidfd], SUPERVISOR_KILL_S)
        return killed

    def detach(self) -> None:
        """Leave the run to its supervisor: :meth:`close` will not wait for it."""
        self.detached = True

    async def close(self) -> None:
        """Release our ends (without ``stop``: a run still going carries on alone)."""
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()
            self._writer = None
        pidfd, self._pidfd = self._pidfd, None
        proc, self._proc = self._proc, None
        try:
            if pidfd is not None and self.detached and not has_exited(pidfd):
                if proc is not None:
                    _reap_later(proc, pidfd)  # it takes the pidfd over
                    pidfd = None
                return
            # Its journal ended: it is exiting. Once it has, nothing of the run is left
            # (one still writing what a full disk held back is reaped once it has:
            # docs/detached-runs.md).
            if (
                pidfd is not None
                and self.gone.done()
                and await wait_exited([pidfd], CLOSE_S)
                and proc is not None
            ):
                _reap_later(proc, pidfd)
                pidfd = None
                return
            if proc is not None:
                proc.poll()  # our child: reap it
        finally:
            for fd in (pidfd, self._claude_fd):
                if fd is not None:
                    os.close(fd)
            self._claude_fd = None


def _reap_later(proc: subprocess.Popen[bytes], pidfd: int) -> None:
    """Reap a detached supervisor (our child) once it exits, from the event loop.

    The loop's reader holds the process until then; a bridge that exits
    first leaves it to init (the usual case: a detach is a shutdown).
    """
    loop = asyncio.get_running_loop()

    def reap() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        proc.poll()

    loop.add_reader(pidfd, reap)


def _pin(pid: int, *, parent: int) -> int | None:
    """A pidfd for ``pid`` if it is still ``parent``'s child (else it is gone already)."""
    return _pin_if(pid, lambda fields: int(fields[1]) == parent)


def pin_started(pid: int, start: int) -> int | None:
    """A pidfd for ``pid`` if it is the process that started at ``start`` and is not a zombie."""
    return _pin_if(pid, lambda fields: fields[0] not in (b"Z", b"X") and int(fields[19]) == start)


def _pin_if(pid: int, holds: Callable[[list[bytes]], bool]) -> int | None:
    """A pidfd for ``pid`` if its ``/proc/PID/stat`` fields (after the name) satisfy ``holds``.

    Pinned first, checked after: a pid recycled in between fails the check.
    """
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        same = holds(data[data.rfind(b")") + 2 :].split())
    except (OSError, ValueError, IndexError):
        same = False
    if not same:
        os.close(fd)
        return None
    return fd


def supervisor_options(
    request: RunRequest, argv: list[str], *, run_dir: Path, limits: RunLimits
) -> list[str]:
    """The supervisor's options for a run (its id, paths and limits), ``--`` and claude's
    argv: never any chat text. A spare gets them as its orders. The cwd is made absolute
    here, against the bridge's directory (a room's default is "."): the supervisor works
    in the run directory, where a relative one would put claude and its send_file."""
    command = [
        f"--run-id={request.run_id}", f"--run-dir={run_dir}", f"--cwd={request.cwd.absolute()}",
        f"--grace-s={request.stop_grace_s!r}",
        f"--run-timeout-s={request.run_timeout_s!r}",
        f"--idle-timeout-s={request.idle_timeout_s!r}",
        f"--orphan-timeout-s={request.orphan_timeout_s!r}",
        f"--spool-max-bytes={request.spool_max_bytes}",
        f"--max-line-bytes={request.max_line_bytes}",
    ]  # fmt: skip
    if request.send_file_max_bytes is not None:
        # The supervisor answers claude's send_file tool (runner/mcp_server.py).
        command.append(f"--send-file-max-bytes={request.send_file_max_bytes}")
    if limits.cgroup_parent:
        command.append(f"--cgroup={limits.cgroup_parent}")
        if limits.memory_max is not None:
            command.append(f"--memory-max={limits.memory_max}")
        if limits.pids_max is not None:
            command.append(f"--pids-max={limits.pids_max}")
    return [*command, "--", *argv]


def supervisor_argv(options: list[str], conn_fd: int) -> list[str]:
    """The command line of a supervisor started for its run (``options``: see
    :func:`supervisor_options`)."""
    return [*bare_argv(str(SUPERVISOR)), f"--conn-fd={conn_fd}", *options]


def _attach(offset: int) -> bytes:
    return protocol.attach(PROTOCOL_VERSIONS, offset)


async def _line(reader: asyncio.StreamReader) -> bytes | None:
    """The next line; None if the connection ended or broke first."""
    try:
        return await reader.readuntil(b"\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        return None


async def _welcome(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The supervisor's first line (``welcome``); None if the connection ended first.

    Raises :class:`Refused` for a supervisor that speaks none of our versions.
    """
    return protocol.read_answer(await _line(reader), PROTOCOL_VERSIONS)


async def start(
    request: RunRequest,
    argv: list[str],
    *,
    env: Mapping[str, str],
    run_dir: Path,
    limits: RunLimits,
    first: bytes,
    spares: Spares | None = None,
) -> Supervised:
    """Start the supervisor, hand it ``first`` for claude's stdin (whole lines: the
    prompt's user message, or a prestart's ``initialize``), and wait until claude
    runs under it.

    Raises :class:`SpawnFailed` when claude could not be started (the
    supervisor has then exited), ``OSError`` when the supervisor itself could
    not. Cancelled, it stops whatever started (SIGTERM to the supervisor is a
    stop) and waits for it.
    """
    stages.stamp("spawn")
    options = supervisor_options(request, argv, run_dir=run_dir, limits=limits)
    # What exec refuses (a NUL, a name with "=") fails the start here, as said below,
    # not in a spare, whose failed exec of claude reads as a bad claude binary.
    spare = spares.take() if spares is not None and _execable(options, env) else None
    if spare is not None and spare.send(options, env):
        proc, ours = spare.proc, spare.conn
    else:
        proc, ours = _start_supervisor(options, env, run_dir)
    stages.stamp("supervisor_forked")
    pidfd = os.pidfd_open(proc.pid)  # our child: its pid is not reused before we reap it
    writer: asyncio.StreamWriter | None = None
    try:
        ours.setblocking(False)
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        writer.write(_attach(0) + protocol.stdin(first))
        supervised = await _spawned(request.run_id, reader, writer, run_dir, proc, pidfd, limits)
    except BaseException:
        if writer is not None:
            writer.close()
        else:
            ours.close()
        await shielded(_abandon(proc, pidfd, request.stop_grace_s))
        raise
    finally:
        if spares is not None:
            spares.refill_soon()
    stages.stamp("claude_spawned")
    return supervised


def _execable(options: list[str], env: Mapping[str, str]) -> bool:
    """Whether exec takes ``options`` (claude's argv among them) and ``env`` as they are."""
    return not any("\0" in a for a in options) and all(
        k and "=" not in k and "\0" not in k and "\0" not in v for k, v in env.items()
    )


def _start_supervisor(
    options: list[str], env: Mapping[str, str], run_dir: Path
) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Start a supervisor for the run (no spare was ready): it and our end of its connection."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            # Not asyncio's subprocess: its transport kills the child when closed,
            # and this one must outlive us. Forking here is as quick as there.
            proc = subprocess.Popen(
                supervisor_argv(options, theirs.fileno()),
                env=dict(env),
                cwd=run_dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # Its own session: the service's terminal signals never reach the run.
                start_new_session=True,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()  # only the supervisor may hold it: its death must end the connection
    except BaseException:
        ours.close()
        raise
    return proc, ours


async def _spawned(  # noqa: PLR0917
    run_id: RunId,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    run_dir: Path,
    proc: subprocess.Popen[bytes],
    pidfd: int,
    limits: RunLimits,
) -> Supervised:
    """Read ``welcome``, the journal's ``hello`` and ``spawned``: the run as a :class:`Supervised`.

    A connection that ends or breaks first is not the start's failure: the
    supervisor may have finished already (claude exited without reading all
    of the prompt, and the rest of it broke the connection). The supervisor
    is given its kill phase to exit and the journal's file read from where
    the connection left off. Raises :class:`Unanswered` (having stopped the
    run) for a supervisor that says nothing of claude within :data:`WELCOME_S`.
    """
    early: dict[str, Record] = {}
    fields: dict[str, Any] | None = None
    offset = 0
    source: asyncio.StreamReader | None = None
    from_file = False
    try:
        async with asyncio.timeout(WELCOME_S):
            if await _welcome(reader) is not None:
                fields, offset = await _until_spawned(reader, offset, early)
                source = reader if fields is not None else None
    except TimeoutError:
        killed = await _kill_unanswered(run_id, str(run_dir), pidfd, proc.pid)
        raise Unanswered(
            f"the run's supervisor did not say claude runs within {WELCOME_S:g} s; "
            f"the bridge stopped the run ({killed} process(es))"
        ) from None
    if source is None:
        writer.close()
        await wait_exited([pidfd], SUPERVISOR_KILL_S)
        source = journal_from(run_dir, offset)
        from_file = True
        if source is not None:
            fields, offset = await _until_spawned(source, offset, early)
    if source is None or fields is None:
        await wait_exited([pidfd], SUPERVISOR_KILL_S)
        raise SpawnFailed(f"the run's supervisor exited with {proc.poll()}", None)
    if fields["t"] == "spawn_failed":
        raise SpawnFailed(str(fields.get("error")), fields.get("errno"))
    hello = early["hello"].fields if "hello" in early else {}
    live = LiveRun(
        run_id=run_id,
        supervisor_pid=proc.pid,
        supervisor_start=int(hello.get("start", 0)),
        claude_pid=fields["pid"],
        run_dir=str(run_dir),
        host=socket.gethostname(),
    )
    supervised = Supervised(
        run_id,
        source,
        None if from_file else writer,
        live=live,
        offset=offset,
        proc=proc,
        pidfd=pidfd,
    )
    supervised._note(Record("spawned", fields, b"", offset))
    supervised.unwritable_at_start = early.get("unwritable")
    if protocol.version_of(hello):
        supervised.version = hello["v"]
    if fields.get("cgroup_error"):
        # Said once at start-up; worth a warning per run only when limits are lost.
        level = logging.WARNING if limits.memory_max or limits.pids_max else logging.DEBUG
        log.log(level, "run %s has no cgroup of its own: %s", run_id, fields["cgroup_error"])
    return supervised


async def _until_spawned(
    source: asyncio.StreamReader, offset: int, early: dict[str, Record]
) -> tuple[dict[str, Any] | None, int]:
    """Read records up to ``spawned`` or ``spawn_failed`` (``early`` gets the ones on the
    way by kind: ``hello``, and ``unwritable`` if the disk was full from the start): that
    record, or None if the stream ended first; and the offset just past it."""
    while (line := await _line(source)) is not None:
        fields = parse_header(line)
        offset += len(line)
        if fields["t"] in ("spawned", "spawn_failed"):
            return fields, offset
        early.setdefault(fields["t"], Record(fields["t"], fields, b"", offset))
    return None, offset


async def _kill_unanswered(run_id: RunId, run_dir: str, pidfd: int, pid: int) -> int:
    """Stop the run of a supervisor that does not answer: its tree, its cgroup, the sweep."""
    log.error("run %s: its supervisor %d does not answer; killing its tree", run_id, pid)
    killed = await kill_tree(pidfd, pid)
    cgroup = _journal_cgroup(run_dir)
    if cgroup:
        killed += await kill_cgroup(cgroup)
    killed += await kill_marked(run_id, grace_s=0)
    await wait_exited([pidfd], SUPERVISOR_KILL_S)
    return killed


def _journal_cgroup(run_dir: str) -> str | None:
    """The run's cgroup from its journal's ``spawned`` record, if it is there."""
    try:
        with open(os.path.join(run_dir, JOURNAL), "rb") as f:
            for _ in range(4):  # hello, spawned: at the start
                fields = parse_header(f.readline())
                if fields["t"] == "spawned":
                    cgroup: str | None = fields.get("cgroup")
                    return cgroup
    except (OSError, Malformed):
        pass
    return None


async def _abandon(proc: subprocess.Popen[bytes], pidfd: int, grace_s: float) -> None:
    """A start that went wrong or was cancelled: stop what started, wait for it, reap it."""
    try:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        if await wait_exited([pidfd], grace_s + SUPERVISOR_KILL_S):
            await kill_tree(pidfd, proc.pid)
            await wait_exited([pidfd], SUPERVISOR_KILL_S)
        proc.poll()
    finally:
        os.close(pidfd)


async def attach(run_id: RunId, live: LiveRun) -> Supervised | None:
    """Attach to a live supervisor of ``live`` at offset 0; None if it is gone.

    Raises :class:`Refused` for a supervisor that speaks none of our versions,
    :class:`Unanswered` for one that does not answer within :data:`WELCOME_S`
    (frozen, stuck: the run is stopped without it first).
    """
    if live.host != socket.gethostname():
        return None
    pidfd = pin_started(live.supervisor_pid, live.supervisor_start)
    if pidfd is None:
        return None
    writer: asyncio.StreamWriter | None = None
    supervised: Supervised | None = None
    try:
        try:
            async with asyncio.timeout(WELCOME_S):  # a connect too waits on a frozen one
                sock = await _connect(live.run_dir)
                if sock is not None:
                    reader, writer = await asyncio.open_unix_connection(sock=sock)
                    writer.write(_attach(0))
                    welcome = await _welcome(reader)
                    if welcome is not None:
                        supervised = Supervised(run_id, reader, writer, live=live, pidfd=pidfd)
                        size, version = welcome.get("size"), welcome.get("v")
                        supervised.history_end = size if isinstance(size, int) else 0
                        supervised.version = version if isinstance(version, int) else 1
                        return supervised
        except TimeoutError:
            killed = await _kill_unanswered(run_id, live.run_dir, pidfd, live.supervisor_pid)
            raise Unanswered(
                f"the run's supervisor did not answer within {WELCOME_S:g} s; "
                f"the bridge stopped the run ({killed} process(es))"
            ) from None
        # Alive but not serving: it is finishing (or stuck); its journal tells.
        if await wait_exited([pidfd], FINISH_S):
            log.error("run %s: its supervisor neither serves nor exits; killing it", run_id)
            await kill_tree(pidfd, live.supervisor_pid)
        return None
    finally:
        if supervised is None:  # else it owns the connection and the pidfd
            if writer is not None:
                writer.close()
            os.close(pidfd)


async def _connect(run_dir: str) -> socket.socket | None:
    """Connect to the run's socket through a directory fd (socket paths are short)."""
    try:
        dirfd = os.open(run_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, f"/proc/self/fd/{dirfd}/{SOCK}")
    except OSError:
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    finally:
        os.close(dirfd)
    return sock


def replay(run_id: RunId, live: LiveRun) -> Supervised | None:
    """The run's journal from its file, for a supervisor that is gone; None if unreadable."""
    reader = journal_from(live.run_dir, 0)
    if reader is None:
        return None
    supervised = Supervised(run_id, reader, None, live=live)
    with contextlib.suppress(OSError):  # its supervisor is gone: the file no longer grows
        supervised.history_end = os.path.getsize(os.path.join(live.run_dir, JOURNAL))
    return supervised


def journal_from(run_dir: str | Path, offset: int) -> asyncio.StreamReader | None:
    """The run's journal file from ``offset`` on, as it is now; None if unreadable."""
    try:
        with open(os.path.join(run_dir, JOURNAL), "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return None
    reader = asyncio.StreamReader(limit=max(len(data), 2**16))
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def journal_start(run_dir: Path) -> tuple[int, int] | None:
    """The supervisor's pid and start time from the journal's ``hello``, if readable."""
    try:
        with open(run_dir / JOURNAL, "rb") as f:
            fields = json.loads(f.readline())
        return int(fields["pid"]), int(fields["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return None

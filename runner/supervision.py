"""The bridge's side of a run's supervisor (``runner/supervisor.py``): a client of its socket.

The supervisor is started detached (a session of its own, ``subprocess.Popen``
rather than an asyncio subprocess, whose transport kills its child when
closed), with one end of a socketpair as its first connection. It owns
claude's pipes and journals them; the bridge reads the journal over the
connection (docs/detached-runs.md), from offset 0 whether the run is new,
re-attached after a restart, or over and only its journal is left: one
reader (:class:`Supervised`) for all three.

The connection's end after the ``done`` record is the run's end; an end
before it means the supervisor died. Closing our end without ``stop``
leaves the run to the supervisor (a detach): it goes on journaling and a
later bridge attaches again.
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
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.core import stages
from bridge.core.aio import shielded
from bridge.core.model import LiveRun, RunId
from runner.process import has_exited, kill_cgroup, kill_marked, kill_tree, wait_exited
from runner.request import RunRequest
from runner.supervisor import DONE_LINGER_S, JOURNAL, KILL_DEADLINE_S, SOCK

log = logging.getLogger(__name__)

SUPERVISOR = Path(__file__).with_name("supervisor.py")
BOOTSTRAP = (
    "import sys; sys.path.append(sys.argv[1].rpartition('/')[0]); "
    "import supervisor; sys.exit(supervisor.main(sys.argv[2:]))"
)
"""Runs the supervisor by its path as a module, not as a script: a script is compiled
at every start (about 6 ms for this one, more than all its imports), a module's
compiled form is cached beside it (the bridge's own import keeps it fresh). Its
directory goes last on the path, after the standard library it imports."""
PROTOCOL_VERSIONS = (1,)
"""The journal and socket protocol versions this bridge reads."""

SUPERVISOR_KILL_S = KILL_DEADLINE_S + 1.0
"""The supervisor's own bound after its grace period, plus slack."""
CLOSE_S = 1.0
"""After the connection ended: how long the supervisor may take to exit (to be reaped)."""
FINISH_S = DONE_LINGER_S + 1.0
"""A supervisor that no longer accepts connections is finishing: how long it may take."""


@dataclass(frozen=True)
class Limits:
    """Where the run's cgroup goes and what it may use; an empty parent means no cgroup."""

    cgroup_parent: str = ""
    memory_max: int | None = None
    pids_max: int | None = None


class SpawnFailed(Exception):
    """The supervisor could not start claude; ``errno`` is the OSError's, if any."""

    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno


class Refused(Exception):
    """The supervisor speaks none of this bridge's protocol versions (it is newer)."""


@dataclass(frozen=True, slots=True)
class Record:
    """One journal record: ``kind`` is its ``t``; ``end`` the journal offset just past it."""

    kind: str
    fields: dict[str, Any]
    payload: bytes
    end: int


def header(kind: str, **fields: object) -> bytes:
    return json.dumps({"t": kind, **fields}, separators=(",", ":")).encode() + b"\n"


STOP = header("stop")


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
        self._claude_fd: int | None = None
        self.cgroup: str | None = None
        """The run's cgroup v2 group, if it has one (from the ``spawned`` record)."""
        loop = asyncio.get_running_loop()
        self.claude_exit: asyncio.Future[int] = loop.create_future()
        """claude's return code (negative for a signal), once it exited."""
        self.survivors: list[int] | None = None
        """Pids that survived SIGKILL, from the supervisor's ``done`` (None: no such record)."""
        self.gone: asyncio.Future[None] = loop.create_future()
        """Done once the journal ended: after ``done``, or because the supervisor died."""
        self.detached = False

    @property
    def contained(self) -> bool:
        """The supervisor said it stopped the whole run (its ``done`` record)."""
        return self.survivors is not None

    async def read(self) -> Record | None:
        """The next record, or None once the journal (or the connection) ended."""
        try:
            line = await self._reader.readuntil(b"\n")
            fields = json.loads(line)
            n = fields.get("n", 0) if isinstance(fields, dict) else 0
            payload = await self._reader.readexactly(n) if n else b""
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
            TypeError,
            OSError,
        ):
            # The end, a torn last record, or a broken connection: the journal ends here.
            if not self.gone.done():
                self.gone.set_result(None)
            return None
        self._offset += len(line) + len(payload)
        record = Record(str(fields.get("t")), fields, payload, self._offset)
        self._note(record)
        return record

    def _note(self, record: Record) -> None:
        match record.kind:
            case "spawned":
                self.cgroup = record.fields.get("cgroup") or None
                if self._pidfd is not None and self._claude_fd is None:
                    self._claude_fd = _pin(self.claude_pid, parent=self.live.supervisor_pid)
            case "exited" if not self.claude_exit.done():
                self.claude_exit.set_result(int(record.fields.get("code", -1)))
            case "done":
                self.survivors = [int(p) for p in record.fields.get("survivors", [])]

    def send(self, data: bytes) -> None:
        """Send records to the supervisor (none once it is gone or we detached)."""
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)

    async def drain(self) -> None:
        if self._writer is not None and not self._writer.is_closing():
            with contextlib.suppress(ConnectionError):
                await self._writer.drain()

    def stop(self) -> None:
        """Ask the supervisor to stop the run (TERM, grace, KILL); idempotent.

        A supervisor that is gone cannot: :meth:`wait` then returns at once
        and :attr:`contained` tells that :meth:`contain` has to.
        """
        self.send(STOP)

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
            if pidfd is not None and self.gone.done():
                # Its journal ended: it is exiting. Once it has, nothing of the run is left.
                await wait_exited([pidfd], CLOSE_S)
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
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        ppid = int(data[data.rfind(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        ppid = -1
    if ppid != parent:
        os.close(fd)
        return None
    return fd


def pin_started(pid: int, start: int) -> int | None:
    """A pidfd for ``pid`` if it is the process that started at ``start`` and is not a zombie."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rfind(b")") + 2 :].split()
        same = fields[0] not in (b"Z", b"X") and int(fields[19]) == start
    except (OSError, ValueError, IndexError):
        same = False
    if not same:
        os.close(fd)
        return None
    return fd


def supervisor_argv(
    request: RunRequest, argv: list[str], *, run_dir: Path, conn_fd: int, limits: Limits
) -> list[str]:
    """The supervisor's command line: the run's id, paths, limits and fd, never any chat text."""
    command = [
        sys.executable, "-I", "-S", "-c", BOOTSTRAP, str(SUPERVISOR),
        f"--run-id={request.run_id}", f"--run-dir={run_dir}", f"--cwd={request.cwd}",
        f"--conn-fd={conn_fd}", f"--grace-s={request.stop_grace_s!r}",
        f"--run-timeout-s={request.run_timeout_s!r}",
        f"--idle-timeout-s={request.idle_timeout_s!r}",
        f"--orphan-timeout-s={request.orphan_timeout_s!r}",
        f"--spool-max-bytes={request.spool_max_bytes}",
        f"--max-line-bytes={request.max_line_bytes}",
    ]  # fmt: skip
    if limits.cgroup_parent:
        command.append(f"--cgroup={limits.cgroup_parent}")
        if limits.memory_max is not None:
            command.append(f"--memory-max={limits.memory_max}")
        if limits.pids_max is not None:
            command.append(f"--pids-max={limits.pids_max}")
    return [*command, "--", *argv]


def stdin_records(prompt: str) -> bytes:
    """The prompt as claude's whole stdin: a ``stdin`` record, then ``eof``."""
    data = prompt.encode()
    return b'{"t":"stdin","n":%d}\n%s{"t":"eof"}\n' % (len(data), data)


def attach_record(offset: int) -> bytes:
    return header("attach", v=list(PROTOCOL_VERSIONS), offset=offset)


async def _welcome(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The supervisor's first line (``welcome``); None if the connection ended first.

    Raises :class:`Refused` for a supervisor that speaks none of our versions.
    """
    try:
        first = json.loads(await reader.readuntil(b"\n"))
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
        return None
    if not isinstance(first, dict):
        return None
    if first.get("t") == "refused":
        raise Refused(
            f"the run's supervisor speaks protocol version(s) {first.get('v')}, "
            f"this bridge {list(PROTOCOL_VERSIONS)}"
        )
    return first if first.get("t") == "welcome" else None


async def start(
    request: RunRequest,
    argv: list[str],
    *,
    env: Mapping[str, str],
    run_dir: Path,
    limits: Limits,
) -> Supervised:
    """Start the supervisor, hand it the prompt, and wait until claude runs under it.

    Raises :class:`SpawnFailed` when claude could not be started (the
    supervisor has then exited), ``OSError`` when the supervisor itself could
    not. Cancelled, it stops whatever started (SIGTERM to the supervisor is a
    stop) and waits for it.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stages.stamp("spawn")
    try:
        try:
            # Not asyncio's subprocess: its transport kills the child when closed,
            # and this one must outlive us. Forking here is as quick as there.
            proc = subprocess.Popen(  # noqa: ASYNC220
                supervisor_argv(
                    request, argv, run_dir=run_dir, conn_fd=theirs.fileno(), limits=limits
                ),
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
    stages.stamp("supervisor_forked")
    pidfd = os.pidfd_open(proc.pid)  # our child: its pid is not reused before we reap it
    writer: asyncio.StreamWriter | None = None
    try:
        ours.setblocking(False)
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        writer.write(attach_record(0) + stdin_records(request.prompt))
        first = await _welcome(reader)
        supervised = await _spawned(
            request.run_id, reader, writer, run_dir, proc, pidfd, first, limits=limits
        )
    except BaseException:
        if writer is not None:
            writer.close()
        else:
            ours.close()
        await shielded(_abandon(proc, pidfd, request.stop_grace_s))
        raise
    stages.stamp("claude_spawned")
    return supervised


async def _spawned(  # noqa: PLR0917
    run_id: RunId,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    run_dir: Path,
    proc: subprocess.Popen[bytes],
    pidfd: int,
    welcome: dict[str, Any] | None,
    *,
    limits: Limits,
) -> Supervised:
    """Read the journal's ``hello`` and ``spawned``; the run as a :class:`Supervised`."""
    hello: dict[str, Any] = {}
    offset = 0
    while welcome is not None:
        try:
            line = await reader.readuntil(b"\n")
            fields = json.loads(line)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
            break
        offset += len(line)
        kind = fields.get("t") if isinstance(fields, dict) else None
        if kind == "hello":
            hello = fields
        elif kind == "spawned":
            live = LiveRun(
                run_id=run_id,
                supervisor_pid=proc.pid,
                supervisor_start=int(hello.get("start", 0)),
                claude_pid=int(fields["pid"]),
                run_dir=str(run_dir),
                host=socket.gethostname(),
            )
            supervised = Supervised(
                run_id, reader, writer, live=live, offset=offset, proc=proc, pidfd=pidfd
            )
            supervised._note(Record(kind, fields, b"", offset))
            if fields.get("cgroup_error"):
                # Said once at start-up; worth a warning per run only when limits are lost.
                level = logging.WARNING if limits.memory_max or limits.pids_max else logging.DEBUG
                log.log(
                    level, "run %s has no cgroup of its own: %s", run_id, fields["cgroup_error"]
                )
            return supervised
        elif kind == "spawn_failed":
            raise SpawnFailed(str(fields.get("error")), fields.get("errno"))
    await wait_exited([pidfd], SUPERVISOR_KILL_S)
    raise SpawnFailed(f"the run's supervisor exited with {proc.poll()}", None)


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

    Raises :class:`Refused` for a supervisor that speaks none of our versions.
    """
    if live.host != socket.gethostname():
        return None
    pidfd = pin_started(live.supervisor_pid, live.supervisor_start)
    if pidfd is None:
        return None
    writer: asyncio.StreamWriter | None = None
    supervised: Supervised | None = None
    try:
        sock = await _connect(live.run_dir)
        if sock is not None:
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            writer.write(attach_record(0))
            if await _welcome(reader) is not None:
                supervised = Supervised(run_id, reader, writer, live=live, pidfd=pidfd)
                return supervised
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
    try:
        with open(os.path.join(live.run_dir, JOURNAL), "rb") as f:
            data = f.read()
    except OSError:
        return None
    reader = asyncio.StreamReader(limit=max(len(data), 2**16))
    reader.feed_data(data)
    reader.feed_eof()
    return Supervised(run_id, reader, None, live=live)


def journal_start(run_dir: Path) -> tuple[int, int] | None:
    """The supervisor's pid and start time from the journal's ``hello``, if readable."""
    try:
        with open(run_dir / JOURNAL, "rb") as f:
            fields = json.loads(f.readline())
        return int(fields["pid"]), int(fields["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return None

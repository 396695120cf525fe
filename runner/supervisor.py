"""The supervisor of one run: claude's parent, its pipes' owner, the run's journal and guard.

Started detached under ``python -I -S`` (standard library only, via :mod:`runner.bare`), or as
a spare (:func:`standby`). It starts claude in ``--cwd``, journals its output and serves the
run's socket in ``--run-dir``; a child subreaper (with ``--cgroup``, in a cgroup of its own),
it stops the whole tree on ``stop``, a signal, a time limit, the orphan timeout or claude's
exit, and exits only once nothing of the run is left (docs/detached-runs.md: "The journal",
"The socket", "The bridge's side (`runner`)"; docs/operations.md, "What contains a run").
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import sys
import time

from runner import protocol
from runner.forkexec import CgroupRefused, spawn
from runner.journal import (
    JOURNAL,
    SOCK,
    Journal,
    is_kept,
    is_result,
    replayed_uuid,
    sent_uuid,
)
from runner.mcp_server import SERVER_NAME as MCP_SERVER_NAME
from runner.mcp_server import Server as McpServer
from runner.proctree import (
    KILL_POLL_S,
    Cgroup,
    cgroup_parent,
    descendants,
    signal_all,
    start_time,
)

TYPE_CHECKING = False
"""As ``typing.TYPE_CHECKING`` (mypy takes either), without importing ``typing`` at each start."""

if TYPE_CHECKING:
    from typing import Any

KILL_DEADLINE_S = 5.0
"""After SIGKILL: how long to keep killing and reaping before giving up (D state)."""
RMDIR_DEADLINE_S = 1.0
"""How long an emptied cgroup may stay busy before it is left behind."""
DONE_LINGER_S = 10.0
"""After ``done``: how long the attached bridge has to read the rest (the journal keeps it)."""
FLUSH_RETRY_S = 0.25
"""While a full disk holds records back: how often writing them is tried again."""
CLOSE_DRAIN_S = 2.0
"""At exit, after our side of a connection is shut: how long the bridge has to close its own
(what it still sends is read meanwhile, so the close is an end for it, never a reset)."""
READ_CHUNK = 256 * 1024
STDERR_TAIL_BYTES = 8 * 1024
"""Over the spool cap: how much of the end of stderr is still journaled when claude exits."""
MAX_HEADER_BYTES = 64 * 1024
"""A bridge's record header longer than this is not one: the connection is dropped."""

EXIT_CLEAN = 0
EXIT_SURVIVORS = 1
EXIT_USAGE = 2
EXIT_SPAWN_FAILED = 3

_PR_SET_CHILD_SUBREAPER = 36
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_WRITE = selectors.EVENT_WRITE


def _read(fd: int) -> bytes | None:
    """What a non-blocking ``fd`` has now: None if nothing yet, ``b""`` at its end (or an
    error, which ends it the same way)."""
    try:
        return os.read(fd, READ_CHUNK)
    except BlockingIOError:
        return None
    except OSError:
        return b""


class Options:
    """The parsed command line. A plain class: ``dataclasses`` (with ``inspect``)
    would add about a quarter to this process's start-up, which every run waits for."""

    __slots__ = (
        "argv",
        "cgroup",
        "conn_fd",
        "cwd",
        "env",
        "grace_s",
        "idle_timeout_s",
        "max_line_bytes",
        "memory_max",
        "orphan_timeout_s",
        "pids_max",
        "run_dir",
        "run_id",
        "run_timeout_s",
        "send_file_max_bytes",
        "spool_max_bytes",
    )

    def __init__(
        self,
        *,
        run_id: str,
        run_dir: str,
        cwd: str,
        grace_s: float,
        argv: list[str],
        conn_fd: int = -1,
        run_timeout_s: float = 1800.0,
        idle_timeout_s: float = 600.0,
        orphan_timeout_s: float = 600.0,
        spool_max_bytes: int = 64 * 1024 * 1024,
        max_line_bytes: int = 16 * 1024 * 1024,
        cgroup: str = "",
        memory_max: int | None = None,
        pids_max: int | None = None,
        send_file_max_bytes: int | None = None,
    ) -> None:
        self.run_id = run_id
        self.run_dir = run_dir
        self.cwd = cwd
        self.grace_s = grace_s
        self.argv = argv
        self.conn_fd = conn_fd
        self.run_timeout_s = run_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.orphan_timeout_s = orphan_timeout_s
        self.spool_max_bytes = spool_max_bytes
        self.max_line_bytes = max_line_bytes
        self.cgroup = cgroup
        self.memory_max = memory_max
        self.pids_max = pids_max
        self.send_file_max_bytes = send_file_max_bytes
        """Set: this process answers claude's ``send_file`` tool (``mcp_message``)."""
        self.env: dict[str, str] | None = None
        """claude's environment; None: this process's own (started for its run)."""


def parse(args: list[str]) -> Options:
    """``--name=value`` options, ``--``, then claude's argv. Raises ValueError, KeyError."""
    if "--" not in args:
        raise ValueError("missing -- before claude's argv")
    split = args.index("--")
    values: dict[str, str] = {}
    for arg in args[:split]:
        name, eq, value = arg.partition("=")
        if not name.startswith("--") or not eq:
            raise ValueError(f"bad option {arg!r}")
        values[name[2:]] = value
    argv = args[split + 1 :]
    if not argv:
        raise ValueError("no claude argv")

    def optional_int(name: str) -> int | None:
        value = values.pop(name, "")
        return int(value) if value else None

    options = Options(
        run_id=values.pop("run-id"),
        run_dir=values.pop("run-dir"),
        cwd=values.pop("cwd"),
        grace_s=float(values.pop("grace-s")),
        argv=argv,
        conn_fd=int(values.pop("conn-fd", "-1")),
        run_timeout_s=float(values.pop("run-timeout-s")),
        idle_timeout_s=float(values.pop("idle-timeout-s")),
        orphan_timeout_s=float(values.pop("orphan-timeout-s")),
        spool_max_bytes=int(values.pop("spool-max-bytes")),
        max_line_bytes=int(values.pop("max-line-bytes")),
        cgroup=values.pop("cgroup", ""),
        memory_max=optional_int("memory-max"),
        pids_max=optional_int("pids-max"),
        send_file_max_bytes=optional_int("send-file-max-bytes"),
    )
    if values:
        raise ValueError(f"unknown options {sorted(values)}")
    if not options.run_id or "/" in options.run_id or options.run_id.startswith("."):
        raise ValueError(f"bad run id {options.run_id!r}")
    return options


def mcp_reply(request_id: str, request: dict[str, object], server: McpServer | None) -> bytes:
    """The ``control_response`` line to an ``mcp_message`` control request: the JSON-RPC
    answer of ``server`` (every message gets one, a notification an empty result, as
    claude expects of its host), or an error for a server that is not ours."""
    message = request.get("message")
    if server is None or request.get("server_name") != MCP_SERVER_NAME:
        response: dict[str, object] = {
            "subtype": "error",
            "request_id": request_id,
            "error": f"no MCP server {request.get('server_name')!r} here",
        }
    else:
        try:
            answer = server.handle(message) if isinstance(message, dict) else None
        except Exception as exc:  # a bug of the server must not end the run
            failed = {"code": -32603, "message": f"internal error: {exc!r}"}
            answer = {"jsonrpc": "2.0", "id": _id(message), "error": failed}
        mcp = answer if answer is not None else {"jsonrpc": "2.0", "result": {}}
        response = {
            "subtype": "success",
            "request_id": request_id,
            "response": {"mcp_response": mcp},
        }
    line = json.dumps({"type": "control_response", "response": response}, ensure_ascii=True)
    return line.encode() + b"\n"


def _id(message: object) -> object:
    return message.get("id") if isinstance(message, dict) else None


def _control_request(obj: dict[str, object], subtype: str) -> tuple[str, dict[str, object]] | None:
    """``(request_id, request)`` if ``obj`` is claude's control request of ``subtype``."""
    request, request_id = obj.get("request"), obj.get("request_id")
    if (
        obj.get("type") != "control_request"
        or not isinstance(request, dict)
        or request.get("subtype") != subtype
        or not isinstance(request_id, str)
    ):
        return None
    return request_id, request


def _object(line: bytes) -> dict[str, object]:
    try:
        obj = json.loads(line)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


# --- the bridge's connections -------------------------------------------------


class Client:
    """A bridge's connection: its records in, the journal out from its offset."""

    __slots__ = ("attached", "closing", "events", "fd", "head", "inbox", "offset", "out")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.inbox = bytearray()
        self.head: dict[str, Any] | None = None
        """A header whose payload has not fully arrived."""
        self.out = bytearray()
        """Lines of our own (``welcome``, ``refused``) that go before the journal."""
        self.offset = 0
        self.attached = False
        self.closing = False
        """Close once ``out`` is sent (after ``refused``)."""
        self.events = 0
        """What the selector watches this connection for."""


# --- the supervisor -----------------------------------------------------------


class Supervisor:
    """Journals, relays and reaps; stops the tree once asked, expired, orphaned or claude exited."""

    def __init__(self, options: Options, journal: Journal, listener: socket.socket | None) -> None:
        self.options = options
        self.journal = journal
        self.listener = listener
        self.me = os.getpid()
        self.selector = selectors.DefaultSelector()
        self.claude = 0
        self.cgroup: Cgroup | None = None
        self.claude_running = False
        self.has_children = True
        """As of the last :meth:`reap`: False once no child is left, hence no descendant."""
        self.stop_signalled = False
        self.stop_deadline: float | None = None
        """Set once the stop began: when the grace period ends."""
        self.kill_deadline: float | None = None
        self.interrupt_deadline: float | None = None
        """Set once a time limit interrupted claude (SIGINT): when the stop begins if
        claude has not exited by then."""
        self.exit_code: int | None = None
        """Set once ``done`` is written: the run is over."""
        self.done_deadline = 0.0
        now = time.monotonic()
        self.run_deadline = now + options.run_timeout_s
        self.last_output = now
        self.orphan_since: float | None = now
        """Since when no bridge is attached (None while one is)."""
        self.clients: dict[int, Client] = {}
        self.stdin = -1
        self.stdin_buf = bytearray()
        self.stdin_eof = False
        self.stdin_events = 0
        self.stdout = -1
        self.stderr = -1
        self.partial = bytearray()
        """The start of a stdout line whose newline has not come yet."""
        self.skipping = False
        """Over the cap: the rest of a dropped over-long line is dropped too."""
        self.dropped_out = 0
        self.dropped_err = 0
        self.err_tail = bytearray()
        self.unechoed: set[str] = set()
        """User messages written to claude's stdin that it has not echoed (taken) yet."""
        self.settled = False
        """A ``result`` came after every user message written was echoed: claude is idle
        with nothing pending, so while no bridge is attached its stdin is closed."""
        limit = options.send_file_max_bytes
        self.mcp = None if limit is None else McpServer(options.cwd, limit)
        """Answers claude's ``send_file`` (None: the run has none)."""
        self.asking: set[str] = set()
        """claude's permission requests (``can_use_tool``) not answered yet: while it
        waits on its host (a person deciding in chat) it is not stalled."""
        if listener is not None:
            self.selector.register(listener, selectors.EVENT_READ, self.accept)

    # -- claude's pipes --

    def attach_claude(
        self, pid: int, cgroup: Cgroup | None, stdin: int, stdout: int, stderr: int
    ) -> None:
        self.claude = pid
        self.cgroup = cgroup
        self.claude_running = True
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        for fd in (stdin, stdout, stderr):
            os.set_blocking(fd, False)
        self.selector.register(stdout, selectors.EVENT_READ, self.read_stdout)
        self.selector.register(stderr, selectors.EVENT_READ, self.read_stderr)

    def read_stdout(self, fd: int, mask: int) -> bool:
        """Journal what claude printed; whether there was anything to read."""
        data = _read(fd)
        if data is None:
            return False
        if not data:
            self._close_stdout()
            return False
        self.last_output = time.monotonic()
        nl = data.rfind(b"\n")
        if nl < 0:
            self.partial += data
        else:
            if self.partial:
                self.partial += data[: nl + 1]
                lines = bytes(self.partial)
                self.partial.clear()
            else:
                lines = data[: nl + 1]
            self.partial += data[nl + 1 :]
            self.journal_out(lines, whole=True)
            self.note_out(lines)  # after: a stdin_closed it causes follows the result
        if len(self.partial) > self.options.max_line_bytes:
            # The bridge fails such a line anyway; memory stays bounded here.
            self.journal_out(bytes(self.partial), whole=False)
            self.partial.clear()
        return True

    def _close_stdout(self) -> None:
        if self.stdout < 0:
            return
        if self.partial:  # a last line without newline stands alone
            self.journal_out(bytes(self.partial), whole=False, last=True)
            self.partial.clear()
        self.selector.unregister(self.stdout)
        os.close(self.stdout)
        self.stdout = -1

    def journal_out(self, data: bytes, *, whole: bool, last: bool = False) -> None:
        """Journal stdout bytes; over the cap only the lines :func:`is_kept` keeps (the
        result, echoes, control lines: what the run's end depends on), whole lines only.

        ``last``: ``data`` is what claude wrote after its last newline, and stdout
        ended: a line of its own (the bridge frames it at ``exited``), kept if kept.
        """
        if not self.capped():
            self.skipping = False
            self.journal.append(protocol.out(len(data)), data)
            return
        if last and not self.skipping and is_kept(data):
            self.flush_dropped()
            self.journal.append(protocol.out(len(data)), data)
            return
        if not whole:  # a piece of a line, never a whole result line: the rest goes too
            self.dropped_out += len(data)
            self.skipping = True
            return
        kept = []
        for i, line in enumerate(data.split(b"\n")[:-1]):
            if (i == 0 and self.skipping) or not is_kept(line):
                self.dropped_out += len(line) + 1
            else:
                kept.append(line)
        self.skipping = False
        if kept:
            self.flush_dropped()
            out = b"\n".join(kept) + b"\n"
            self.journal.append(protocol.out(len(out)), out)

    def capped(self) -> bool:
        """Whether only the lines the run depends on are journaled: the spool cap is
        reached, or a full disk keeps as much in memory as it may."""
        return self.journal.size >= self.options.spool_max_bytes or self.journal.full

    def note_out(self, lines: bytes) -> None:
        """Follow claude's whole stdout lines for the end rule: echoes and results.

        Cheap: two substring searches per read; a line is parsed only if it may
        be an echo or a result (docs/detached-runs.md, protocol version 2).
        """
        if b'"mcp_message"' in lines:
            self.answer_mcp(lines)
        asks = b'"can_use_tool"' in lines or b'"control_cancel_request"' in lines
        if not asks and b'"isReplay"' not in lines and b'"result"' not in lines:
            return
        for line in lines.split(b"\n"):
            uid = replayed_uuid(line)
            if uid is not None:
                self.unechoed.discard(uid)
            elif not self.unechoed and is_result(line):
                self.settled = True
            elif asks:
                self.note_asking(line)
        self.auto_eof()

    def answer_mcp(self, lines: bytes) -> None:
        """Answer claude's requests to the run's own MCP server, ``chatbridge``
        (``send_file``), which claude reaches through its host as an SDK server:
        no process of its own to start, claude's start-up waits for none, and
        it answers while no bridge is attached too (docs/files.md)."""
        for line in lines.split(b"\n"):
            if b'"mcp_message"' not in line:
                continue
            asked = _control_request(_object(line), "mcp_message")
            if asked is not None:
                self.reply_stdin(mcp_reply(*asked, self.mcp))

    def reply_stdin(self, line: bytes) -> None:
        """A line of this process's own for claude's stdin (after the bridge's lines
        already queued: each of those is whole)."""
        if self.stdin < 0:
            return  # claude closed it (exiting): nobody waits for the answer
        self.stdin_buf += line
        self.write_stdin()

    def note_asking(self, line: bytes) -> None:
        """Follow which permission requests claude waits on (asked, withdrawn)."""
        if b'"can_use_tool"' not in line and b'"control_cancel_request"' not in line:
            return
        obj = _object(line)
        withdrawn = obj.get("request_id")
        if obj.get("type") == "control_cancel_request" and isinstance(withdrawn, str):
            self.answered(withdrawn)
        elif (asked := _control_request(obj, "can_use_tool")) is not None:
            self.asking.add(asked[0])

    def answered(self, request_id: str) -> None:
        if request_id in self.asking:
            self.asking.discard(request_id)
            if not self.asking:
                self.last_output = time.monotonic()  # claude works again: its idle clock too

    def note_in(self, payload: bytes) -> None:
        """A user message written to claude's stdin is pending until claude echoes it;
        an answer to a permission request ends claude's wait on its host."""
        answers = b'"control_response"' in payload and bool(self.asking)
        if b'"user"' not in payload and not answers:
            return
        for line in payload.split(b"\n"):
            uid = sent_uuid(line)
            if uid is not None:
                self.unechoed.add(uid)
                self.settled = False
            elif answers and b'"control_response"' in line:
                response = _object(line).get("response")
                if isinstance(response, dict) and isinstance(response.get("request_id"), str):
                    self.answered(response["request_id"])

    def auto_eof(self) -> None:
        """With no bridge attached to say ``eof``, close claude's stdin once it is settled:
        a detached run ends as it would have with a bridge."""
        if not self.settled or self.stdin < 0 or self.stdin_eof:
            return
        if any(c.attached for c in self.clients.values()):
            return
        self.stdin_eof = True
        self.write_stdin()

    def read_stderr(self, fd: int, mask: int) -> bool:
        """Journal what claude wrote to stderr; whether there was anything to read."""
        data = _read(fd)
        if data is None:
            return False
        if not data:
            self.selector.unregister(fd)
            os.close(fd)
            self.stderr = -1
            return False
        if not self.capped():
            self.journal.append(protocol.err(len(data)), data)
        else:
            self.dropped_err += len(data)
            self.err_tail += data
            del self.err_tail[:-STDERR_TAIL_BYTES]
        return True

    def flush_dropped(self) -> None:
        """Journal what the cap left out: its counts, and stderr's end (the why of a failure)."""
        if self.err_tail:
            tail = bytes(self.err_tail)
            self.err_tail.clear()
            self.journal.append(protocol.err(len(tail)), tail)
        if self.dropped_out or self.dropped_err:
            self.journal.append(protocol.dropped(self.dropped_out, self.dropped_err))
            self.dropped_out = self.dropped_err = 0

    def write_stdin(self, fd: int = -1, mask: int = 0) -> None:
        if self.stdin < 0:
            self.stdin_buf.clear()
            return
        try:
            while self.stdin_buf:
                del self.stdin_buf[: os.write(self.stdin, self.stdin_buf)]
        except BlockingIOError:
            self._watch_stdin(selectors.EVENT_WRITE)
            return
        except OSError:  # claude closed it (exited): what is left cannot be delivered
            self.stdin_buf.clear()
            self.close_stdin()
            return
        self._watch_stdin(0)
        if self.stdin_eof:
            self.close_stdin()

    def _watch_stdin(self, events: int) -> None:
        if events == self.stdin_events:
            return
        if self.stdin_events and events:
            self.selector.modify(self.stdin, events, self.write_stdin)
        elif events:
            self.selector.register(self.stdin, events, self.write_stdin)
        else:
            self.selector.unregister(self.stdin)
        self.stdin_events = events

    def close_stdin(self) -> None:
        if self.stdin < 0:
            return
        self._watch_stdin(0)
        os.close(self.stdin)
        self.stdin = -1
        self.journal.append(protocol.stdin_closed())

    # -- the bridge's connections --

    def take_inherited(self) -> None:
        """The first connection, inherited: it already holds the prompt for claude."""
        if self.options.conn_fd >= 0:
            self.add_client(self.options.conn_fd)
            self.read_client(self.options.conn_fd, selectors.EVENT_READ)

    def accept(self, fd: int, mask: int) -> None:
        if self.listener is None:
            return
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.add_client(conn.detach())

    def add_client(self, fd: int) -> None:
        os.set_blocking(fd, False)
        client = Client(fd)
        self.clients[fd] = client
        client.events = selectors.EVENT_READ
        self.selector.register(fd, client.events, self.read_client)

    def drop(self, client: Client) -> None:
        if self.clients.pop(client.fd, None) is None:
            return
        self.selector.unregister(client.fd)
        os.close(client.fd)
        if client.attached and not any(c.attached for c in self.clients.values()):
            self.orphan_since = time.monotonic()
            self.auto_eof()

    def read_client(self, fd: int, mask: int) -> None:
        client = self.clients[fd]
        if mask & selectors.EVENT_WRITE:
            self.send(client)
            if fd not in self.clients or not mask & selectors.EVENT_READ:
                return
        data = _read(fd)
        if data is None:
            return
        if not data:
            self.drop(client)
            return
        client.inbox += data
        inbox = client.inbox
        while fd in self.clients:
            head = client.head
            if head is None:
                nl = inbox.find(b"\n")
                if nl < 0:
                    if len(inbox) > MAX_HEADER_BYTES:
                        self.drop(client)
                    return
                head = protocol.read_command(inbox[:nl])
                del inbox[: nl + 1]
                if head is None:
                    self.drop(client)
                    return
            n = head.get("n", 0)
            if len(inbox) < n:
                client.head = head
                return
            payload = bytes(inbox[:n])
            del inbox[:n]
            client.head = None
            self.on_message(client, head, payload)

    def on_message(self, client: Client, head: dict[str, Any], payload: bytes) -> None:
        kind = head.get("t")
        if kind == "attach":
            self.on_attach(client, head)
        elif not client.attached:
            self.drop(client)  # nothing before attach
        elif kind == "stdin":
            if self.stdin >= 0 and not self.stdin_eof:
                # Journaled as written (whole lines): a restarted bridge rebuilds from
                # it which messages were sent and which requests were answered.
                self.journal.append(protocol.written_in(len(payload)), payload)
                self.note_in(payload)
                self.stdin_buf += payload
                self.write_stdin()
        elif kind == "eof":
            self.stdin_eof = True
            self.write_stdin()
        elif kind == "stop":
            self.stop("asked")
        # Anything else is from a later version: ignored.

    def on_attach(self, client: Client, head: dict[str, Any]) -> None:
        versions = protocol.attach_versions(head, protocol.PROTOCOL_VERSIONS)
        if not versions:
            client.out += protocol.refused(protocol.PROTOCOL_VERSIONS)
            client.closing = True
            self.send(client)
            return
        for other in list(self.clients.values()):
            if other is not client and other.attached:
                self.drop(other)  # one bridge at a time: the newer takes over
        size = self.journal.size
        client.offset = protocol.attach_offset(head, size)
        client.attached = True
        self.orphan_since = None
        client.out += protocol.welcome(max(versions), size)
        self.send(client)

    def send(self, client: Client) -> None:
        """Send what the client has not got yet, as far as its socket takes it now."""
        journal = self.journal
        try:
            while client.out:
                del client.out[: os.write(client.fd, client.out)]
            if client.closing:
                self.drop(client)
                return
            if client.attached:
                while client.offset < journal.written:
                    sent = os.sendfile(
                        client.fd, journal.read_fd, client.offset, journal.written - client.offset
                    )
                    if sent == 0:
                        break
                    client.offset += sent
                # What a full disk holds back comes from memory, in the journal's order.
                while journal.written <= client.offset < journal.size:
                    client.offset += os.write(client.fd, journal.held_from(client.offset))
        except BlockingIOError:
            pass
        except OSError:
            self.drop(client)
            return
        behind = bool(client.out) or (client.attached and client.offset < journal.size)
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if behind else 0)
        if events != client.events:
            client.events = events
            self.selector.modify(client.fd, events, self.read_client)

    def relay(self) -> None:
        """Bring every attached bridge up to the journal's end (after it grew); and
        write what a full disk held back, if it can be now."""
        journal = self.journal
        if journal.held and journal.flush() and self.exit_code is None:
            journal.append(protocol.writable(journal.held_period))
        size = journal.size
        for client in list(self.clients.values()):
            # One that waits for its socket to drain is sent to when it does.
            if client.attached and client.offset < size and not client.events & _WRITE:
                self.send(client)

    # -- the run's processes --

    def reap(self) -> bool:
        """Collect every exited child; False once there is no child left at all."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.has_children = False
                return False
            if pid == 0:
                return True
            if pid == self.claude and self.claude_running:
                self.claude_running = False
                self.claude_exited(os.waitstatus_to_exitcode(status))

    def claude_exited(self, code: int) -> None:
        # Everything claude wrote is in its pipes now: journal it before ``exited``,
        # so a reader has all of claude's own output first.
        while self.stdout >= 0 and self.read_stdout(self.stdout, selectors.EVENT_READ):
            pass
        while self.stderr >= 0 and self.read_stderr(self.stderr, selectors.EVENT_READ):
            pass
        if self.partial:  # stdout may still be open (a tool holds it): the line ended all the same
            self.journal_out(bytes(self.partial), whole=False, last=True)
            self.partial.clear()
        self.flush_dropped()
        self.close_stdin()
        self.journal.append(protocol.exited(code))

    def stop(self, why: str) -> None:
        """Begin the stop, once: SIGTERM to the whole tree; the grace period starts now."""
        if self.stop_deadline is not None:
            return
        self.journal.append(protocol.stopping(why))
        self.stop_deadline = time.monotonic() + self.options.grace_s
        self._signal_tree((signal.SIGTERM,))

    def expire(self, status: str) -> None:
        """A time limit passed (the run's, the stall's, or no bridge attached for
        ``orphan_timeout_s``). claude is interrupted first (SIGINT: it ends its turn
        with a result that says what the run cost, and exits), given the grace period,
        then the tree is stopped (SIGTERM, on which claude prints no result)."""
        self.journal.append(protocol.expired(status))
        if self.claude and self.claude_running:
            with contextlib.suppress(OSError):
                os.kill(self.claude, signal.SIGINT)
            self.interrupt_deadline = time.monotonic() + self.options.grace_s
            return
        self.stop("expired")

    def kill_tree(self) -> None:
        """Freeze and kill whatever of the run is left."""
        if self.cgroup is not None and self.cgroup.kill():
            pass  # atomic: a fork in flight lands in the group and dies with it
        self._signal_tree((signal.SIGSTOP, signal.SIGKILL))

    def _signal_tree(self, sigs: tuple[signal.Signals, ...]) -> None:
        tree = self._tree()
        mine = {self.me, *tree}
        signal_all(tree, sigs, mine)

    def _tree(self) -> list[int]:
        """The run's live processes; none without a scan once no child is left.

        A subreaper without a child has no descendant at all (the usual end:
        claude exited and left nothing), so /proc is not read then. Otherwise
        the scan of descendants joins the cgroup's list: a process that moved
        itself out of the group is still a descendant and still gets the
        SIGTERM. (This process is the run's own, so a scan here never holds up
        the bridge's event loop.)
        """
        if not self.has_children:
            return []
        return self.survivors()

    def survivors(self) -> list[int]:
        tree = descendants(self.me)
        if self.cgroup is not None:
            tree = list(dict.fromkeys([*tree, *self.cgroup.procs()]))
        return tree

    def finish(self, survivors: list[int], code: int | None = None) -> None:
        """The run is over: the last records; from now on only the bridge is served."""
        if self.cgroup is not None and not survivors:
            self.cgroup.remove(RMDIR_DEADLINE_S)
        for fd in (self.stdout, self.stderr):
            if fd >= 0:
                self.selector.unregister(fd)
                os.close(fd)
        self.stdout = self.stderr = -1
        self.flush_dropped()
        self.close_stdin()
        self.journal.append(protocol.done(survivors))
        if self.listener is not None:
            # A bridge that comes now reads the journal instead.
            self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None
            with contextlib.suppress(OSError):
                os.unlink(SOCK)
        if code is None:
            code = EXIT_SURVIVORS if survivors else EXIT_CLEAN
        self.exit_code = code
        self.done_deadline = time.monotonic() + DONE_LINGER_S

    def check_limits(self, now: float) -> None:
        """Expire the run at a time limit; stop it once an interrupt's grace ran out."""
        options = self.options
        if self.stop_deadline is not None:
            return
        if self.interrupt_deadline is not None:
            if now >= self.interrupt_deadline:
                self.stop("expired")
        elif now >= self.run_deadline:
            self.expire("timed_out")
        elif not self.asking and now >= self.last_output + options.idle_timeout_s:
            self.expire("stalled")
        elif self.orphan_since is not None and now >= self.orphan_since + options.orphan_timeout_s:
            self.expire("orphaned")

    def serve(self) -> int:
        """The event loop: claude's pipes, the bridge's connections, signals, deadlines."""
        options = self.options
        while True:
            if self.exit_code is None:
                has_children = self.reap()
                if self.stop_signalled:
                    self.stop("signal")
                elif self.claude and not self.claude_running:
                    # After the reaping: with no child left the stop scans nothing.
                    self.stop("exited")
                self.check_limits(time.monotonic())
            now = time.monotonic()
            timeout: float | None
            if self.exit_code is not None:
                timeout = self._linger(now)
                if timeout is None:
                    return self._exit()
            elif self.stop_deadline is not None:
                empty = not has_children and not (self.cgroup and self.cgroup.procs())
                if empty:
                    self.finish([])
                    continue
                if now >= self.stop_deadline:
                    if self.kill_deadline is None:
                        self.kill_deadline = now + KILL_DEADLINE_S
                    elif now >= self.kill_deadline:
                        self.finish(self.survivors())
                        continue
                    self.kill_tree()
                    timeout = KILL_POLL_S
                else:
                    timeout = self.stop_deadline - now
            elif self.interrupt_deadline is not None:
                timeout = max(0.0, self.interrupt_deadline - now)
            else:
                deadline = self.run_deadline
                if not self.asking:
                    deadline = min(deadline, self.last_output + options.idle_timeout_s)
                if self.orphan_since is not None:
                    deadline = min(deadline, self.orphan_since + options.orphan_timeout_s)
                timeout = max(0.0, deadline - now)
            if self.journal.held:  # (held: written again soon)
                timeout = min(timeout, FLUSH_RETRY_S)
            self.relay()
            for key, mask in self.selector.select(timeout):
                key.data(key.fd, mask)
            self.relay()

    def _linger(self, now: float) -> float | None:
        """After ``done``: how long to wait for the bridge to read the rest; None: exit now."""
        self.relay()
        if not any(c.attached and c.events & _WRITE for c in self.clients.values()):
            return None
        if now >= self.done_deadline:
            return None
        return self.done_deadline - now

    def write_held(self) -> None:
        """After ``done`` and the connections: what a full disk still holds is written as
        soon as it can be, for at most ``--orphan-timeout-s`` after ``done`` (or until a
        stop signal). Even if the bridge read all of it: one that dies before it acted on
        what it read (the answer not posted yet) reads it again from the file."""
        until = self.done_deadline - DONE_LINGER_S + self.options.orphan_timeout_s
        journal = self.journal
        self.stop_signalled = False  # (one that stopped the run is long handled)
        while journal.held and not journal.flush():
            if self.stop_signalled or time.monotonic() >= until:
                return
            time.sleep(FLUSH_RETRY_S)  # nothing else to serve: the disk is all it waits for

    def _exit(self) -> int:
        """Close the connections gracefully, then exit.

        Closing a Unix socket with unread data (a late ``stop``, the rest of a
        prompt claude never read) makes the peer's reads fail, not end, and
        asyncio then drops what the bridge had received but not read yet. So
        our side is shut first (the bridge reads an end after the journal) and
        what the bridge still sends is read until it closes its side, for at
        most :data:`CLOSE_DRAIN_S`. (The bridge does not depend on it: a
        connection that ends before ``done`` sends it to the journal's file.)
        """
        clients = list(self.clients.values())
        draining = selectors.DefaultSelector()
        for client in clients:
            with contextlib.suppress(OSError):
                sock = socket.socket(fileno=client.fd)
                try:
                    sock.shutdown(socket.SHUT_WR)
                finally:
                    sock.detach()
                draining.register(client.fd, selectors.EVENT_READ)
        deadline = time.monotonic() + CLOSE_DRAIN_S
        while draining.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in draining.select(left):
                try:
                    data = os.read(key.fd, READ_CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    draining.unregister(key.fd)
        draining.close()
        for client in clients:
            self.drop(client)
        self.write_held()
        return EXIT_CLEAN if self.exit_code is None else self.exit_code


class _Wakeup:
    """Signals arrive through the wakeup fd; a stop signal sets the supervisor's flag."""

    def __init__(self, supervisor: Supervisor, fd: int) -> None:
        self.supervisor = supervisor
        supervisor.selector.register(fd, selectors.EVENT_READ, self.drain)

    def drain(self, fd: int, mask: int) -> None:
        try:
            while os.read(fd, 512):
                pass
        except BlockingIOError:
            pass

    def stop(self, signum: int, frame: object) -> None:
        self.supervisor.stop_signalled = True


def _make_cgroup(options: Options) -> tuple[Cgroup | None, str]:
    """The run's cgroup if one was asked for and could be made, else why not.

    Without one the run is still contained (the subreaper); the bridge said
    at start-up whether groups and limits are available.
    """
    if not options.cgroup:
        return None, ""
    try:
        cgroup = Cgroup(cgroup_parent(options.cgroup), options.run_id)
        cgroup.create(options.memory_max, options.pids_max)
    except OSError as exc:
        return None, str(exc)
    return cgroup, ""


def _start_claude(options: Options, supervisor: Supervisor) -> str | None:
    """Spawn claude under the supervisor; None, or why it could not (journaled)."""
    journal = supervisor.journal
    cgroup, cgroup_error = _make_cgroup(options)
    stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
    stdout_r, stdout_w = os.pipe2(os.O_CLOEXEC)
    stderr_r, stderr_w = os.pipe2(os.O_CLOEXEC)
    theirs = (stdin_r, stdout_w, stderr_w)
    try:
        try:
            claude = spawn(options.argv, options.cwd, theirs, cgroup, options.env)
        except CgroupRefused as exc:
            # As when the group cannot be made, the run goes on without it (the
            # subreaper still contains it).
            if cgroup is None:  # (only a group can refuse)
                raise
            cgroup_error = f"cannot move claude into {cgroup.path}: {exc}"
            cgroup.remove(RMDIR_DEADLINE_S)
            cgroup = None
            claude = spawn(options.argv, options.cwd, theirs, None, options.env)
    except (OSError, ValueError, CgroupRefused) as exc:
        code = exc.errno if isinstance(exc, OSError) else None
        journal.append(protocol.spawn_failed(str(exc), code))
        if cgroup is not None:
            cgroup.remove(0)
        for fd in (*theirs, stdin_w, stdout_r, stderr_r):
            os.close(fd)
        return str(exc)
    # Only claude and its descendants hold these ends now: their end is the run's end.
    for fd in theirs:
        os.close(fd)
    journal.append(protocol.spawned(claude, cgroup.path if cgroup else None, cgroup_error))
    supervisor.attach_claude(claude, cgroup, stdin_w, stdout_r, stderr_r)
    return None


def _listen() -> socket.socket | None:
    """The run's socket, bound relative to the run directory (a socket path may not
    exceed 107 bytes); None if it cannot be: the inherited connection still works."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SOCK)
        listener.bind(SOCK)
        listener.listen(8)
        listener.setblocking(False)
    except OSError:
        listener.close()
        return None
    return listener


def standby(args: list[str]) -> Options | None:
    """A spare (``--standby --conn-fd=N``): started ahead of its run, with the
    imports done, it waits for its orders on stdin: one JSON object, ``args`` (the
    command line it would have been started with, without ``--conn-fd``) and
    ``env`` (claude's environment, which this process was not started with).
    End of input without orders: the bridge let it go (or died): None.
    Raises ValueError, KeyError for bad orders."""
    values = dict(arg.partition("=")[::2] for arg in args)
    conn_fd = int(values["--conn-fd"])
    chunks = []
    while chunk := os.read(0, READ_CHUNK):
        chunks.append(chunk)
    if not chunks:
        return None
    command, env = protocol.read_orders(b"".join(chunks))
    options = parse(command)
    options.conn_fd = conn_fd
    options.env = env
    # Nothing reads stdin any more; claude gets pipes of its own.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return options


def main(args: list[str]) -> int:
    try:
        options = standby(args[1:]) if args[:1] == ["--standby"] else parse(args)
        if options is None:
            return EXIT_CLEAN
        os.chdir(options.run_dir)
    except (ValueError, KeyError, OSError) as exc:
        sys.stderr.write(f"supervisor: {exc}\n")
        return EXIT_USAGE
    # The wakeup fd first: a stop signal from now on stops the run, even one
    # before claude started. A handler (not SIG_DFL) so SIGCHLD reaches it too.
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    journal = Journal(JOURNAL)
    journal.append(
        protocol.hello(
            v=protocol.PROTOCOL_VERSIONS[-1],
            run=options.run_id,
            pid=os.getpid(),
            start=start_time(),
            # For a restart's recovery: a supervisor that was a spare has no
            # --grace-s on its command line (runner/recovery.py).
            grace_s=options.grace_s,
        )
    )
    supervisor = Supervisor(options, journal, _listen())
    wakeup = _Wakeup(supervisor, wake_r)
    for sig in _STOP_SIGNALS:
        signal.signal(sig, wakeup.stop)
    if not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        journal.append(protocol.spawn_failed("cannot become a child subreaper", None))
        supervisor.finish([], EXIT_SPAWN_FAILED)
    elif _start_claude(options, supervisor) is not None:
        supervisor.finish([], EXIT_SPAWN_FAILED)
    supervisor.take_inherited()  # after the spawn: claude's stdin is there now
    return supervisor.serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The run's journal: the file the supervisor appends its records to (:mod:`runner.protocol`).

The supervisor writes the journal and relays it; the bridge reads the same records, from
the socket or from the file (docs/detached-runs.md, "The journal"). Standard library only:
the supervisor imports it.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import json
import os

from runner import protocol

JOURNAL = "journal"
SOCK = "sock"


HELD_MAX_BYTES = 8 * 1024 * 1024
"""While the journal cannot be written (a full disk), at most this much of claude's
output is held in memory; past it stdout and stderr are capped as by the spool cap."""


class Journal:
    """The run's journal: records appended with ``write(2)``, read back by ``sendfile``.

    ``size`` is the journal's logical length: what is in the file (``written``)
    and, after it, the records a full disk kept out (``held``, in memory, in
    order). Held records are written before any later one, as soon as a write
    succeeds again, so the file is always a prefix of the journal made of
    whole records; readers of the socket get held records from memory.
    """

    def __init__(self, path: str, held_max_bytes: int = HELD_MAX_BYTES) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
        self.fd = os.open(path, flags, 0o600)
        self.read_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = 0
        self.written = 0
        self._held: list[bytes] = []
        """The records held, in order; those before ``_first`` are written already."""
        self._starts: list[int] = []
        """Each held record's journal offset: a reader's record is found by bisection."""
        self._first = 0
        self.held_bytes = 0
        self.held_max_bytes = held_max_bytes
        self.error: OSError | None = None
        """Why the last write failed (None once everything held is written)."""
        self.held_period = 0
        """Bytes held since the journal became unwritable."""
        self.said_full = False
        """A ``held_full`` record was held: the memory bound is reached."""

    @property
    def held(self) -> int:
        """How many records are held (not written yet)."""
        return len(self._held) - self._first

    @property
    def full(self) -> bool:
        """Held records fill the memory bound: claude's output is to be capped."""
        return self.held_bytes >= self.held_max_bytes

    def append(self, head: bytes, payload: bytes = b"") -> None:
        """Append one record: to the file, or (a full disk) held until it can be."""
        total = len(head) + len(payload)
        if not self.held and self._write(head, payload):
            self.size += total
            return
        if not self.held:  # the first record kept out: says so first, in the journal itself
            exc = self.error or OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self._hold(protocol.unwritable(str(exc), exc.errno))
            self.held_period = 0
        self._hold(head + payload)
        if self.full and not self.said_full:  # the bound: claude's output is capped from here
            self.said_full = True
            self._hold(protocol.held_full(self.held_max_bytes))

    def _hold(self, record: bytes) -> None:
        self._held.append(record)
        self._starts.append(self.size)
        self.held_bytes += len(record)
        self.held_period += len(record)
        self.size += len(record)

    def flush(self) -> bool:
        """Write what is held, in order, as far as the disk takes it; whether all is.
        (The caller says so in the journal, with ``writable``, unless it has ended.)"""
        while self.held:
            record = self._held[self._first]
            if not self._write(record, b""):
                self._forget_written()
                return False
            self._first += 1
            self.held_bytes -= len(record)
        self._held.clear()
        self._starts.clear()
        self._first = 0
        self.error = None
        self.said_full = False
        return True

    def _forget_written(self) -> None:
        """Drop the records written already once they are half the list (amortised: the
        memory bound counts only what is held)."""
        if self._first * 2 >= len(self._held):
            del self._held[: self._first]
            del self._starts[: self._first]
            self._first = 0

    def held_from(self, offset: int) -> bytes:
        """The held bytes from journal ``offset`` (at least :attr:`written`) on: the rest
        of the record ``offset`` falls in."""
        index = bisect.bisect_right(self._starts, offset, lo=self._first) - 1
        if index < self._first or index >= len(self._held):
            return b""
        record = self._held[index]
        skip = offset - self._starts[index]
        return record[skip:] if skip else record

    def _write(self, head: bytes, payload: bytes) -> bool:
        """Write one whole record at the file's end; a record cut short is cut off again."""
        total = len(head) + len(payload)
        try:
            written = os.writev(self.fd, (head, payload) if payload else (head,))
            while 0 < written < total:  # a regular file writes short only when out of space
                step = os.write(self.fd, (head + payload)[written:])
                written = written + step if step else 0
        except OSError as exc:
            self.error = exc
            written = 0
        if written != total:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.written)  # no half record for a reader to choke on
            return False
        self.written += total
        return True


def is_result(line: bytes) -> bool:
    """Whether a stdout line is claude's ``result`` line (parsed only if it may be one:
    ``"result"`` in the raw bytes is a key or that exact string, never escaped text)."""
    obj = _object_with(line, b'"result"')
    return obj is not None and obj.get("type") == "result"


def _object_with(line: bytes, marker: bytes) -> dict[str, object] | None:
    """``line`` as a JSON object, parsed only if ``marker`` is in its raw bytes (lines can
    be MB long: most are never parsed); None if it is not one."""
    if marker not in line:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _user_line(line: bytes, marker: bytes) -> dict[str, object] | None:
    """A ``user`` line as an object, parsed only if ``marker`` is in it."""
    obj = _object_with(line, marker)
    return obj if obj is not None and obj.get("type") == "user" else None


def sent_uuid(line: bytes) -> str | None:
    """The uuid of a user message line written to claude's stdin (None for other lines)."""
    obj = _user_line(line, b'"user"')
    uid = obj.get("uuid") if obj is not None else None
    return uid if isinstance(uid, str) and uid else None


def replayed_uuid(line: bytes) -> str | None:
    """The uuid of a stdout line echoing a user message claude took (``isReplay``).

    A cheap test first: lines can be MB long (tool results), and inside a JSON
    string a quote is escaped, so ``"isReplay"`` in the raw bytes is a key.
    """
    obj = _user_line(line, b'"isReplay"')
    if obj is None or obj.get("isReplay") is not True:
        return None
    uid = obj.get("uuid")
    return uid if isinstance(uid, str) and uid else None


def is_kept(line: bytes) -> bool:
    """Whether a stdout line is journaled over the spool cap: the ``result``, and
    (version 2) the protocol's lines the run's end and its control depend on:
    user message echoes and control requests and responses (all small but a
    permission request's tool input)."""
    if is_result(line) or replayed_uuid(line) is not None:
        return True
    obj = _object_with(line, b'"control_')
    kind = obj.get("type") if obj is not None else None
    return isinstance(kind, str) and kind.startswith("control_")

"""The run's journal: its record format, and the file the supervisor appends to.

A record is a JSON header line with a type ``t``, then ``n`` bytes of
payload when the header has ``n`` (docs/detached-runs.md). The supervisor
writes the journal and relays it; the bridge reads the same records, from
the socket or from the file. Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import contextlib
import json
import os

PROTOCOL_VERSIONS = (1, 2)
"""The journal and socket protocol versions this supervisor speaks (docs/detached-runs.md)."""
JOURNAL = "journal"
SOCK = "sock"


def header(kind: str, **fields: object) -> bytes:
    """A record's header line (docs/detached-runs.md)."""
    return json.dumps({"t": kind, **fields}, separators=(",", ":")).encode() + b"\n"


class Journal:
    """The run's journal: records appended with ``write(2)``, read back by ``sendfile``."""

    def __init__(self, path: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
        self.fd = os.open(path, flags, 0o600)
        self.read_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = 0

    def append(self, head: bytes, payload: bytes = b"") -> None:
        """Append one record. A full disk loses the record, never the run (nor the format)."""
        total = len(head) + len(payload)
        try:
            written = os.writev(self.fd, (head, payload) if payload else (head,))
            while 0 < written < total:  # a regular file writes short only when out of space
                step = os.write(self.fd, (head + payload)[written:])
                written = written + step if step else 0
        except OSError:
            written = 0
        if written != total:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)  # no half record for a reader to choke on
            return
        self.size += total


def is_result(line: bytes) -> bool:
    """Whether a stdout line is claude's ``result`` line (parsed only if it may be one:
    ``"result"`` in the raw bytes is a key or that exact string, never escaped text)."""
    if b'"result"' not in line:
        return False
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    return isinstance(obj, dict) and obj.get("type") == "result"


def _user_line(line: bytes, marker: bytes) -> dict[str, object] | None:
    """A ``user`` line as an object, parsed only if ``marker`` is in it."""
    if marker not in line:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and obj.get("type") == "user" else None


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
    if b'"control_' not in line:
        return False
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    kind = obj.get("type") if isinstance(obj, dict) else None
    return isinstance(kind, str) and kind.startswith("control_")

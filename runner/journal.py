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

PROTOCOL_VERSIONS = (1,)
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
    """Whether a stdout line is claude's ``result`` line (parsed only if it may be one)."""
    if b'"result"' not in line:
        return False
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    return isinstance(obj, dict) and obj.get("type") == "result"

"""The supervisor's protocol, both sides: every record it and the bridge exchange, encoded
and decoded here (docs/detached-runs.md, "The journal" and "The socket").

A record is a JSON header line with a type ``t``, then ``n`` bytes of payload when the
header has ``n``. The journal's records are written by the supervisor (runner/supervisor.py)
and read by the bridge (runner/supervision.py) with :func:`parse_header`; on the socket the
bridge sends commands (:func:`attach`, :func:`stdin`, :data:`EOF`, :data:`STOP`) that the
supervisor reads with :func:`read_command`, and the supervisor answers :func:`welcome` or
:func:`refused`, read with :func:`read_answer`; a spare's :func:`orders` are read with
:func:`read_orders`. Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import json

TYPE_CHECKING = False
"""As ``typing.TYPE_CHECKING`` (mypy takes either), without importing ``typing`` at each start."""

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

PROTOCOL_VERSIONS = (1, 2)
"""The journal and socket protocol versions spoken here (2: streaming input, ``in``
records, the supervisor's own eof)."""


class Malformed(ValueError):
    """A journal record that is not one of the protocol's."""


class Refused(Exception):
    """The supervisor speaks none of this bridge's protocol versions (it is newer)."""


def header(kind: str, **fields: object) -> bytes:
    """A record's header line."""
    return json.dumps({"t": kind, **fields}, separators=(",", ":")).encode() + b"\n"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- the journal: written by the supervisor, read by the bridge --


def hello(*, v: int, run: str, pid: int, start: int, grace_s: float) -> bytes:
    """The journal's first record: who supervises the run, since when, in which version.
    (``grace_s``: for a restart's recovery; a spare has none on its command line.)"""
    return header("hello", v=v, run=run, pid=pid, start=start, grace_s=grace_s)


def spawned(pid: int, cgroup: str | None, cgroup_error: str | None) -> bytes:
    """claude runs as ``pid`` (in ``cgroup``, or why it has none)."""
    return header("spawned", pid=pid, cgroup=cgroup, cgroup_error=cgroup_error)


def spawn_failed(error: str, errno: int | None) -> bytes:
    """claude could not be started."""
    return header("spawn_failed", error=error, errno=errno)


def out(n: int) -> bytes:
    """The header of ``n`` bytes of claude's stdout (byte formatting: the hot path)."""
    return b'{"t":"out","n":%d}\n' % n


def err(n: int) -> bytes:
    """The header of ``n`` bytes of claude's stderr."""
    return b'{"t":"err","n":%d}\n' % n


def written_in(n: int) -> bytes:
    """The header of ``n`` bytes (whole lines) written to claude's stdin (an ``in`` record)."""
    return b'{"t":"in","n":%d}\n' % n


def dropped(out: int, err: int) -> bytes:
    """Bytes of stdout and stderr the spool cap left out."""
    return header("dropped", out=out, err=err)


def stdin_closed() -> bytes:
    return header("stdin_closed")


def unwritable(error: str, errno: int | None) -> bytes:
    """The journal's file cannot be written (a full disk): records are held in memory."""
    return header("unwritable", error=error, errno=errno)


def writable(held: int) -> bytes:
    """The file is written again, ``held`` bytes held meanwhile included."""
    return header("writable", held=held)


def held_full(limit: int) -> bytes:
    """What is held reached its memory bound: claude's output is capped from here."""
    return header("held_full", max=limit)


def exited(code: int) -> bytes:
    """claude exited with ``code`` (negative for a signal)."""
    return header("exited", code=code)


def stopping(why: str) -> bytes:
    return header("stopping", why=why)


def expired(status: str) -> bytes:
    """A time limit or the orphan timeout ended the run."""
    return header("expired", status=status)


def done(survivors: Sequence[int]) -> bytes:
    """The journal's last record: the run is stopped, but for ``survivors`` (SIGKILL failed)."""
    return header("done", survivors=list(survivors))


def parse_header(line: bytes) -> dict[str, Any]:
    """A record's header, checked as far as the bridge relies on its fields. Raises Malformed."""
    try:
        fields = json.loads(line)
    except ValueError as exc:
        raise Malformed(f"not JSON: {line[:80]!r}") from exc
    if not isinstance(fields, dict) or not isinstance(fields.get("t"), str):
        raise Malformed(f"not a record: {line[:80]!r}")
    n = fields.get("n", 0)
    ok = _is_int(n) and n >= 0
    match fields["t"]:
        case "hello":
            ok = ok and _is_int(fields.get("pid")) and _is_int(fields.get("start"))
        case "spawned":
            cgroup = fields.get("cgroup")
            ok = ok and _is_int(fields.get("pid")) and (cgroup is None or isinstance(cgroup, str))
        case "spawn_failed":
            ok = ok and (fields.get("errno") is None or _is_int(fields.get("errno")))
        case "exited":
            ok = ok and _is_int(fields.get("code"))
        case "done":
            survivors = fields.get("survivors")
            ok = ok and isinstance(survivors, list) and all(_is_int(p) for p in survivors)
    if not ok:
        raise Malformed(f"bad {fields['t']} record: {line[:80]!r}")
    return fields


def version_of(fields: Mapping[str, Any]) -> int | None:
    """A ``hello``'s or ``welcome``'s protocol version, if it says one."""
    v = fields.get("v")
    return v if _is_int(v) else None


# -- the socket: the bridge's commands, the supervisor's answers --


def attach(versions: Sequence[int], offset: int) -> bytes:
    """Attach to the journal from ``offset``, speaking one of ``versions``."""
    return header("attach", v=list(versions), offset=offset)


def stdin(data: bytes) -> bytes:
    """``data`` (whole lines) for claude's stdin, as a ``stdin`` record."""
    return b'{"t":"stdin","n":%d}\n%s' % (len(data), data)


EOF = header("eof")
"""claude's stdin is to be closed once what was sent before is written."""
STOP = header("stop")
"""Stop the run (TERM, grace, KILL)."""


def read_command(line: bytes | bytearray) -> dict[str, Any] | None:
    """A command's header; None for one that is no record (the supervisor drops its sender)."""
    try:
        head = json.loads(line)
    except ValueError:
        return None
    if not isinstance(head, dict):
        return None
    n = head.get("n", 0)
    return head if isinstance(n, int) and n >= 0 else None


def attach_versions(head: Mapping[str, Any], spoken: Sequence[int]) -> list[int]:
    """The versions of an ``attach`` that this side speaks too (none: refuse it)."""
    wanted = head.get("v")
    return [v for v in wanted if v in spoken] if isinstance(wanted, list) else []


def attach_offset(head: Mapping[str, Any], size: int) -> int:
    """Where an ``attach`` reads the journal from, within its ``size``."""
    offset = head.get("offset", 0)
    return min(max(offset, 0), size) if isinstance(offset, int) else 0


def welcome(v: int, size: int) -> bytes:
    """The answer to an ``attach``: the version spoken, the journal's length now."""
    return header("welcome", v=v, size=size)


def refused(versions: Sequence[int]) -> bytes:
    """The answer to an ``attach`` in none of the versions spoken here (``versions``)."""
    return header("refused", v=list(versions))


def read_answer(line: bytes | None, spoken: Sequence[int]) -> dict[str, Any] | None:
    """The supervisor's answer to an ``attach`` if it is a ``welcome``; None for anything
    else (the connection ended first). Raises :class:`Refused` for a ``refused``."""
    try:
        first = json.loads(line) if line is not None else None
    except ValueError:
        return None
    if not isinstance(first, dict):
        return None
    if first.get("t") == "refused":
        raise Refused(
            f"the run's supervisor speaks protocol version(s) {first.get('v')}, "
            f"this bridge {list(spoken)}"
        )
    return first if first.get("t") == "welcome" else None


# -- a spare's orders: one JSON object down its pipe --


def orders(args: Sequence[str], env: Mapping[str, str]) -> bytes:
    """A spare's run: its command line (without ``--conn-fd``) and claude's environment."""
    return json.dumps({"args": list(args), "env": dict(env)}).encode()


def read_orders(data: bytes) -> tuple[list[str], dict[str, str]]:
    """A spare's orders: ``(args, env)``. Raises ValueError for bad ones."""
    decoded = json.loads(data)
    command, env = (
        (decoded.get("args"), decoded.get("env")) if isinstance(decoded, dict) else ((), ())
    )
    if not (isinstance(command, list) and all(isinstance(a, str) for a in command)):
        raise ValueError("bad orders: args")
    if not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        raise ValueError("bad orders: env")
    return command, env

"""The supervisor's protocol: each record kind decodes to what was encoded (runner/protocol.py).

One round trip per kind, the values drawn by hypothesis: the journal's records through the
bridge's :func:`parse_header`, the bridge's commands through the supervisor's
:func:`read_command`, the supervisor's answers through :func:`read_answer`, a spare's
orders through :func:`read_orders`.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner import protocol
from runner.protocol import (
    Malformed,
    Refused,
    attach_offset,
    attach_versions,
    parse_header,
    read_answer,
    read_command,
    read_orders,
)

ints = st.integers(min_value=0, max_value=2**62)
signed = st.integers(min_value=-(2**31), max_value=2**31)
texts = st.text(max_size=80)
errnos = st.none() | st.integers(min_value=1, max_value=200)
payloads = st.binary(max_size=256)
versions = st.lists(st.integers(min_value=1, max_value=9), max_size=4)


def journal_record(data: bytes) -> dict[str, Any]:
    """A journal record's header as the bridge reads it, its type and ``t`` checked."""
    assert data.endswith(b"\n")
    assert data.count(b"\n") == 1
    return parse_header(data)


def command(data: bytes) -> tuple[dict[str, Any], bytes]:
    """A command as the supervisor reads it: its header and its payload."""
    line, _, payload = data.partition(b"\n")
    head = read_command(line)
    assert head is not None
    assert len(payload) == head.get("n", 0)
    return head, payload


@given(
    v=st.integers(min_value=1, max_value=9),
    run=texts,
    pid=ints,
    start=ints,
    grace=st.floats(0, 1e6),
)
def test_hello(v: int, run: str, pid: int, start: int, grace: float) -> None:
    fields = journal_record(protocol.hello(v=v, run=run, pid=pid, start=start, grace_s=grace))
    assert fields == {
        "t": "hello",
        "v": v,
        "run": run,
        "pid": pid,
        "start": start,
        "grace_s": grace,
    }
    assert protocol.version_of(fields) == v


@given(pid=ints, cgroup=st.none() | texts, cgroup_error=st.none() | texts)
def test_spawned(pid: int, cgroup: str | None, cgroup_error: str | None) -> None:
    fields = journal_record(protocol.spawned(pid, cgroup, cgroup_error))
    assert fields == {"t": "spawned", "pid": pid, "cgroup": cgroup, "cgroup_error": cgroup_error}


@given(error=texts, errno=errnos)
def test_spawn_failed(error: str, errno: int | None) -> None:
    fields = journal_record(protocol.spawn_failed(error, errno))
    assert fields == {"t": "spawn_failed", "error": error, "errno": errno}


@pytest.mark.parametrize(
    ("kind", "encode"), [("out", protocol.out), ("err", protocol.err), ("in", protocol.written_in)]
)
@given(data=payloads)
def test_output_and_input(kind: str, encode: Any, data: bytes) -> None:
    fields = journal_record(encode(len(data)))
    assert fields == {"t": kind, "n": len(data)}


@given(out=ints, err=ints)
def test_dropped(out: int, err: int) -> None:
    assert journal_record(protocol.dropped(out, err)) == {"t": "dropped", "out": out, "err": err}


def test_stdin_closed() -> None:
    assert journal_record(protocol.stdin_closed()) == {"t": "stdin_closed"}


@given(error=texts, errno=errnos)
def test_unwritable(error: str, errno: int | None) -> None:
    fields = journal_record(protocol.unwritable(error, errno))
    assert fields == {"t": "unwritable", "error": error, "errno": errno}


@given(held=ints)
def test_writable(held: int) -> None:
    assert journal_record(protocol.writable(held)) == {"t": "writable", "held": held}


@given(limit=ints)
def test_held_full(limit: int) -> None:
    assert journal_record(protocol.held_full(limit)) == {"t": "held_full", "max": limit}


@given(code=signed)
def test_exited(code: int) -> None:
    assert journal_record(protocol.exited(code)) == {"t": "exited", "code": code}


@given(why=texts)
def test_stopping(why: str) -> None:
    assert journal_record(protocol.stopping(why)) == {"t": "stopping", "why": why}


@given(status=texts)
def test_expired(status: str) -> None:
    assert journal_record(protocol.expired(status)) == {"t": "expired", "status": status}


@given(survivors=st.lists(ints, max_size=5))
def test_done(survivors: list[int]) -> None:
    assert journal_record(protocol.done(survivors)) == {"t": "done", "survivors": survivors}


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b"[1]\n",
        b'{"n":1}\n',
        b'{"t":"out","n":-1}\n',
        b'{"t":"exited","code":true}\n',
        b'{"t":"done","survivors":[1,"2"]}\n',
        b'{"t":"spawned","pid":1,"cgroup":3}\n',
    ],
)
def test_what_is_no_journal_record_is_malformed(line: bytes) -> None:
    with pytest.raises(Malformed):
        parse_header(line)


@given(wanted=versions, offset=signed, size=ints)
def test_attach(wanted: list[int], offset: int, size: int) -> None:
    head, payload = command(protocol.attach(wanted, offset))
    assert head == {"t": "attach", "v": wanted, "offset": offset}
    assert payload == b""
    assert attach_versions(head, protocol.PROTOCOL_VERSIONS) == [
        v for v in wanted if v in protocol.PROTOCOL_VERSIONS
    ]
    assert attach_offset(head, size) == min(max(offset, 0), size)


@given(data=payloads)
def test_stdin(data: bytes) -> None:
    head, payload = command(protocol.stdin(data))
    assert head == {"t": "stdin", "n": len(data)}
    assert payload == data


def test_eof_and_stop() -> None:
    assert command(protocol.EOF) == ({"t": "eof"}, b"")
    assert command(protocol.STOP) == ({"t": "stop"}, b"")


@pytest.mark.parametrize("line", [b"not json", b'"attach"', b'{"t":"stdin","n":-1}'])
def test_what_is_no_command_drops_its_sender(line: bytes) -> None:
    assert read_command(line) is None


@given(v=st.integers(min_value=1, max_value=9), size=ints)
def test_welcome(v: int, size: int) -> None:
    answer = read_answer(protocol.welcome(v, size), protocol.PROTOCOL_VERSIONS)
    assert answer == {"t": "welcome", "v": v, "size": size}
    assert protocol.version_of(answer) == v


@given(spoken=versions)
def test_refused(spoken: list[int]) -> None:
    with pytest.raises(Refused) as refusal:
        read_answer(protocol.refused(spoken), (1, 2))
    assert f"version(s) {spoken}, this bridge [1, 2]" in str(refusal.value)


def test_an_answer_that_is_none_of_these_is_no_welcome() -> None:
    assert read_answer(None, (1, 2)) is None
    assert read_answer(b"garbage\n", (1, 2)) is None
    assert read_answer(protocol.stdin_closed(), (1, 2)) is None


@given(args=st.lists(texts, max_size=6), env=st.dictionaries(texts, texts, max_size=4))
def test_orders(args: list[str], env: dict[str, str]) -> None:
    assert read_orders(protocol.orders(args, env)) == (args, env)


@pytest.mark.parametrize("data", [b"[]", b'{"args":[1],"env":{}}', b'{"args":[],"env":{"A":1}}'])
def test_bad_orders_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="bad orders"):
        read_orders(data)

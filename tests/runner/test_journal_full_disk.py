"""The state directory's disk full while claude works: nothing claude printed is lost.

The state directory is a small tmpfs of its own (tests/small_disk.py), filled
for real and freed again. The supervisor is the real one
(docs/detached-runs.md, "The journal").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.core.model import LiveRun, RunId, RunStatus
from runner import (
    Allow,
    Init,
    JournalUnwritable,
    PermissionAsked,
    RunControl,
    RunEvent,
    Spawned,
    ToolResult,
    attach_claude,
    run_claude,
)
from runner.journal import Journal
from tests.runner.conftest import Recorder
from tests.runner.containment import until_exited
from tests.runner.detached_runs import (
    EOF,
    detached,
    journal,
    read_line,
    records,
    release,
    waiting_request,
)
from tests.runner.fake_runs import record
from tests.small_disk import SmallDisk, needs_mount

pytestmark = [pytest.mark.slow, needs_mount]

ANSWER = "THE-ANSWER " * 1000
"""Longer than a page: a full tmpfs still takes what fits in a file's last page."""


async def supervisor_gone(recorder: Recorder) -> None:
    """Until the run's supervisor exited (the event loop reaps it)."""
    (spawned,) = recorder.of(Spawned)
    assert spawned.live is not None
    await until_exited([spawned.live.supervisor_pid])
    await asyncio.sleep(0)  # (the loop's reader of its pidfd reaps it now)


async def welcome_size(live: LiveRun) -> int:
    """The journal's length as the supervisor's ``welcome`` says (a bridge's attach)."""
    dirfd = os.open(live.run_dir, os.O_PATH | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(f"/proc/self/fd/{dirfd}/sock")  # (the path may be too long otherwise)
            raw.sendall(b'{"t":"attach","v":[2],"offset":0}\n')
            size: int = (await read_line(raw))["size"]
            return size
    finally:
        os.close(dirfd)


async def held_back(live: LiveRun) -> None:
    """Until the supervisor holds records its file lacks: the journal it would send a
    bridge (its ``welcome``'s size) is longer than the file. (Polled: nothing else says.)"""
    async with asyncio.timeout(10):
        while True:
            try:
                size = await welcome_size(live)
            except (FileNotFoundError, ConnectionError, EOFError):
                # Past ``done`` (it stopped listening, or closed what it had not
                # answered yet), which the file does not have.
                assert b'"t":"done"' not in journal(live)
                return
            if size > len(journal(live)):
                return
            await asyncio.sleep(0.05)


async def test_an_answer_printed_while_the_disk_is_full_reaches_the_live_bridge(
    run_id: RunId, tmp_path: Path, recorder: Recorder, small_disk: SmallDisk
) -> None:
    request = waiting_request(
        run_id, tmp_path, state_dir=small_disk.root / "state", switches={"result": ANSWER}
    )
    task = asyncio.create_task(run_claude(request, recorder))
    await recorder.wait_for(ToolResult)
    small_disk.fill()
    release(tmp_path)
    try:
        # Promptly, not after the idle timeout (60 s): the supervisor relays what it holds.
        report = await asyncio.wait_for(asyncio.shield(task), 30)
    finally:
        small_disk.free()
    await supervisor_gone(recorder)  # it stayed to write what it held
    assert report.status is RunStatus.SUCCEEDED
    assert report.result_text == ANSWER
    (unwritable,) = recorder.of(JournalUnwritable)
    assert "No space left" in unwritable.error


async def test_an_answer_held_for_no_bridge_is_in_the_journal_once_space_returns(
    run_id: RunId, tmp_path: Path, recorder: Recorder, small_disk: SmallDisk
) -> None:
    request = waiting_request(
        run_id, tmp_path, state_dir=small_disk.root / "state", switches={"result": ANSWER}
    )
    live = await detached(request, recorder)
    small_disk.fill()
    release(tmp_path)  # claude answers and (no bridge: the supervisor closes its stdin) exits
    await until_exited([record(tmp_path)["pid"]])
    await held_back(live)
    small_disk.free()

    later = Recorder()
    report = await asyncio.wait_for(attach_claude(request, live, later), 30)
    assert report.status is RunStatus.SUCCEEDED
    assert report.result_text == ANSWER
    kinds = [head["t"] for head, _, _ in records(journal(live))]
    assert kinds[-1] == "done"
    assert "unwritable" in kinds  # it was held, then written
    assert b"THE-ANSWER" in journal(live)


Op = tuple[str, int]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 6000)),
        st.tuples(st.sampled_from(["fill", "free", "flush"]), st.just(0)),
    ),
    max_size=30,
)


def whole_records(data: bytes) -> list[tuple[dict[str, Any], bytes]]:
    """``data`` as records; fails unless it is whole records only."""
    parsed = list(records(data))
    for head, payload, _ in parsed:
        assert len(payload) == head.get("n", 0)
    assert (parsed[-1][2] if parsed else 0) == len(data)
    return [(head, payload) for head, payload, _ in parsed]


def held_bytes(journal: Journal) -> bytes:
    """What the journal holds, read as the supervisor sends it: from the file's end on."""
    out = bytearray()
    while journal.written + len(out) < journal.size:
        piece = journal.held_from(journal.written + len(out))
        assert piece
        out += piece
    return bytes(out)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_the_journal_file_is_always_whole_records_in_order_and_all_once_space_returns(
    small_disk: SmallDisk, ops: list[Op]
) -> None:
    path = small_disk.root / "journal"
    journal = Journal(str(path), held_max_bytes=16_000)
    sent: list[bytes] = []  # the payloads appended, in order
    held, bound = False, False
    try:
        for kind, n in ops:
            if kind == "append":
                payload = str(len(sent)).encode() * (n // 4 + 1)
                sent.append(payload)
                journal.append(b'{"t":"out","n":%d}\n' % len(payload), payload)
            elif kind == "fill" and not small_disk.filler.exists():
                small_disk.fill()
            elif kind == "free" and small_disk.filler.exists():
                small_disk.free()
            elif kind == "flush":
                journal.flush()
            held = held or bool(journal.held)
            bound = bound or journal.full
            data = path.read_bytes()
            assert len(data) == journal.written
            outs = [payload for head, payload in whole_records(data) if head["t"] == "out"]
            assert outs == sent[: len(outs)]  # a prefix of what was appended, in order
            logical = data + held_bytes(journal)  # what a bridge reading from 0 is sent
            assert [p for head, p in whole_records(logical) if head["t"] == "out"] == sent
        if small_disk.filler.exists():
            small_disk.free()
        assert journal.flush()
        written = whole_records(path.read_bytes())
        assert [payload for head, payload in written if head["t"] == "out"] == sent
        kinds = {head["t"] for head, _ in written}
        assert ("unwritable" in kinds) == held
        assert ("held_full" in kinds) == bound
    finally:
        os.close(journal.fd)
        os.close(journal.read_fd)
        path.unlink()


async def test_a_tool_request_made_while_the_disk_is_full_is_asked_and_answered(
    run_id: RunId, tmp_path: Path, recorder: Recorder, small_disk: SmallDisk
) -> None:
    control = RunControl()

    async def on_event(event: RunEvent) -> None:
        await recorder(event)
        if isinstance(event, PermissionAsked):
            assert control.answer(event.request_id, Allow(event.input))
            (tmp_path / "go.2").touch()  # the tool's end lets claude answer

    request = waiting_request(
        run_id,
        tmp_path,
        state_dir=small_disk.root / "state",
        approve_tools=True,
        switches={
            "no_tool": "1",
            "then_tool": "echo " + "x" * 5000,
            "tool_log": str(tmp_path / "tools"),
        },
    )
    task = asyncio.create_task(run_claude(request, on_event, control=control))
    await recorder.wait_for(Init)
    small_disk.fill()
    release(tmp_path)  # claude asks to run its tool now
    try:
        report = await asyncio.wait_for(asyncio.shield(task), 30)  # not the run's timeout
    finally:
        small_disk.free()
    await supervisor_gone(recorder)
    assert report.status is RunStatus.SUCCEEDED, report.error
    (asked,) = recorder.of(PermissionAsked)
    assert asked.tool_name == "Bash"
    assert len((tmp_path / "tools").read_text().splitlines()) == 1
    assert recorder.of(JournalUnwritable)


async def test_records_a_bridge_read_from_memory_and_then_lost_are_written_once_space_returns(
    run_id: RunId, tmp_path: Path, recorder: Recorder, small_disk: SmallDisk
) -> None:
    """A bridge that read the held answer from memory may die before it posted it (a
    chat server's rate limit, a kill -9): the supervisor writes it anyway, so the
    bridge that comes back finds it in the file."""
    request = waiting_request(
        run_id, tmp_path, state_dir=small_disk.root / "state", switches={"result": ANSWER}
    )
    live = await detached(request, recorder)
    small_disk.fill()
    dirfd = os.open(live.run_dir, os.O_PATH | os.O_DIRECTORY)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        raw.connect(f"/proc/self/fd/{dirfd}/sock")
        raw.sendall(b'{"t":"attach","v":[2],"offset":0}\n' + EOF)
        release(tmp_path)
        seen = b""
        while b'{"t":"done"' not in seen:  # all of it, from memory
            chunk = await asyncio.to_thread(raw.recv, 65536)
            assert chunk, seen[-300:]
            seen += chunk
    finally:
        raw.close()  # the bridge dies before it posts the answer
        os.close(dirfd)
    assert b'"t":"done"' not in journal(live)
    with contextlib.suppress(TimeoutError):  # (one that exits now has lost them)
        await until_exited([live.supervisor_pid], within=3)
    small_disk.free()
    await until_exited([live.supervisor_pid])
    kinds = [head["t"] for head, _, _ in records(journal(live))]
    assert kinds[-1] == "done"
    assert b"THE-ANSWER" in journal(live)


def test_a_bridge_is_sent_the_whole_memory_bound_of_the_smallest_records_in_one_pass(
    small_disk: SmallDisk,
) -> None:
    """8 MiB held as the smallest records there are (a claude that writes stderr a few
    bytes at a time) reach a bridge that attaches from the start: each record is found
    from its offset directly (a scan of all held ones per record took half an hour, the
    supervisor serving nothing else meanwhile; pytest's timeout fails it)."""
    path = small_disk.root / "journal"
    journal = Journal(str(path))
    try:
        small_disk.fill()
        while not journal.full:
            journal.append(b'{"t":"err","n":1}\n', b"x")
        sent = bytearray()
        offset = journal.written
        while offset < journal.size:  # as the supervisor's send: what the socket took, on
            piece = journal.held_from(offset)[:7]  # (a socket may take part of a record)
            sent += piece
            offset += len(piece)
        kinds = [head["t"] for head, _, _ in records(bytes(sent))]
        assert kinds[0] == "unwritable"
        assert kinds[-1] == "held_full"
        assert kinds.count("err") > 200_000
        assert len(sent) == journal.size - journal.written
    finally:
        os.close(journal.fd)
        os.close(journal.read_fd)


async def test_a_run_started_while_the_disk_is_full_answers_and_says_so(
    run_id: RunId, tmp_path: Path, recorder: Recorder, small_disk: SmallDisk
) -> None:
    request = waiting_request(
        run_id, tmp_path, state_dir=small_disk.root / "state", switches={"result": ANSWER}
    )
    (small_disk.root / "state").mkdir()
    small_disk.fill()
    release(tmp_path)
    task = asyncio.create_task(run_claude(request, recorder))
    try:
        report = await asyncio.wait_for(asyncio.shield(task), 30)
    finally:
        small_disk.free()
    await supervisor_gone(recorder)
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == ANSWER
    (unwritable,) = recorder.of(JournalUnwritable)  # the room is told, as later in a run
    assert "No space left" in unwritable.error

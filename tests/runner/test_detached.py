"""Runs outlive the bridge (docs/detached-runs.md): the journal, the socket, detach and attach.

A "restart" here is a ``run_claude`` cancelled with ``detach`` saying yes,
then ``attach_claude`` in the same test process: the supervisor is not a
child the bridge's death affects, so that is what a new bridge process sees.
The fake claude waits for a trigger file where a test needs the run to be
in flight; processes are waited for by pidfd, never by a sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import (
    Result,
    RunEvent,
    Spawned,
    ToolResult,
    attach_claude,
    clean_stray_runs,
    remove_run_dir,
    run_claude,
    stray_runs,
    supervision,
)
from runner.bare import bare_argv
from runner.spare import SUPERVISOR
from tests.runner.conftest import Recorder, pids_with_marker
from tests.runner.containment import alive, until_exited
from tests.runner.detached_runs import (
    EOF,
    connect,
    detached,
    journal,
    read_line,
    read_to_end,
    records,
    release,
    waiting_request,
)
from tests.runner.fake_runs import assert_nothing_left, fake_env, make_request, record

pytestmark = pytest.mark.slow
WAIT_S = 30.0


def claude_starts(tmp_path: Path) -> int:
    """How many fake claude processes ran to their end (each appends a line to ``times``)."""
    return len((tmp_path / "times").read_text().splitlines())


class Positions:
    """An ``on_position`` that keeps the offsets, and the events each came before."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.offsets: list[int] = []
        self.before: list[int] = []
        """How many events had been recorded when each offset was told."""

    def __call__(self, offset: int) -> None:
        self.offsets.append(offset)
        self.before.append(len(self.recorder.events))


async def test_the_journal_holds_the_run_and_ends_with_done(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = make_request(
        run_id, tmp_path, env=fake_env(tmp_path, stderr="warming up"), state_dir=tmp_path / "st"
    )
    positions = Positions(recorder)
    report = await run_claude(request, recorder, on_position=positions)
    assert report.status is RunStatus.SUCCEEDED

    (spawned,) = recorder.of(Spawned)
    live = spawned.live
    assert live is not None
    assert live.run_dir == str(tmp_path / "st" / "runs" / run_id)
    assert (Path(live.run_dir).stat().st_mode & 0o777) == 0o700
    assert ((tmp_path / "st").stat().st_mode & 0o777) == 0o700
    assert live.claude_pid == spawned.pid == record(tmp_path)["pid"]
    assert live.host == socket.gethostname()
    data = journal(live)
    heads = [head for head, _, _ in records(data)]
    kinds = [head["t"] for head in heads]
    assert kinds[:2] == ["hello", "spawned"]
    assert kinds[-3:] == ["exited", "stopping", "done"]
    assert heads[0]["pid"] == live.supervisor_pid
    assert heads[0]["start"] == live.supervisor_start
    assert heads[0]["run"] == run_id
    assert "stdin_closed" in kinds
    assert {"t": "stopping", "why": "exited"} in heads
    assert heads[-1] == {"t": "done", "survivors": []}
    out = b"".join(payload for head, payload, _ in records(data) if head["t"] == "out")
    err = b"".join(payload for head, payload, _ in records(data) if head["t"] == "err")
    assert b"warming up" in err
    # Each position is just past a line: the journal's byte there is a newline. Lines
    # are decoded up to the final result (what claude prints after it is not shown).
    lines = out.splitlines()
    last_result = max(i for i, line in enumerate(lines) if b'"type": "result"' in line)
    assert len(positions.offsets) == last_result + 1
    assert all(data[offset - 1 : offset] == b"\n" for offset in positions.offsets)
    assert positions.offsets == sorted(positions.offsets)
    # Told before the line's events were handed on: the result line's comes last.
    assert positions.before[-1] == len(recorder.events) - 1
    assert isinstance(recorder.events[-1], Result)

    # The bridge removes the directory once it recorded the outcome.
    remove_run_dir(live)
    assert not Path(live.run_dir).exists()


async def test_a_relative_state_dir_is_the_working_directorys(
    run_id: RunId, tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default ([runner] state_dir = "chatbridge-state") is relative; the
    # supervisor works inside the run's directory, where it would not resolve.
    monkeypatch.chdir(tmp_path)
    request = make_request(run_id, tmp_path, env=fake_env(tmp_path), state_dir=Path("rel"))
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.SUCCEEDED, report.error
    (spawned,) = recorder.of(Spawned)
    assert spawned.live is not None
    assert spawned.live.run_dir == str(tmp_path / "rel" / "runs" / run_id)


async def test_replay_from_an_offset_then_live(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    live = await detached(waiting_request(run_id, tmp_path), recorder)
    before = journal(live)
    offsets = [end for _, _, end in records(before)]
    offset = offsets[2]  # after hello, spawned, and one more record
    sock = connect(live, offset)
    with sock:
        welcome = await read_line(sock)
        assert welcome == {"t": "welcome", "v": 1, "size": len(before)}
        sock.sendall(EOF)  # claude's input ends (an attached bridge's part)
        release(tmp_path)
        received = await read_to_end(sock)
    # From the offset on, byte for byte: the replay and what came live after it.
    after = journal(live)
    assert received == after[offset:]
    assert after.startswith(before)
    assert [head["t"] for head, _, _ in records(after)][-1] == "done"
    await until_exited([live.supervisor_pid])
    assert_nothing_left(run_id, tmp_path)


async def test_a_second_attach_takes_over_and_an_unknown_version_is_refused(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    live = await detached(waiting_request(run_id, tmp_path), recorder)
    with connect(live) as first:
        assert (await read_line(first))["t"] == "welcome"
        with connect(live, versions=(99,)) as newer:
            assert await read_line(newer) == {"t": "refused", "v": [1, 2]}
            assert await read_to_end(newer) == b""
        with connect(live) as second:
            assert (await read_line(second))["t"] == "welcome"
            # The first one is closed (after what it had been sent).
            await read_to_end(first)
            second.sendall(EOF)  # claude's input ends (an attached bridge's part)
            release(tmp_path)
            data = await read_to_end(second)
    assert [head["t"] for head, _, _ in records(data)][-1] == "done"
    await until_exited([live.supervisor_pid])


async def test_a_later_bridge_attaches_to_a_supervisor_of_this_version(
    run_id: RunId, tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Version skew after an upgrade: the bridge speaks a version 3 as well, the
    # supervisor started by the previous bridge only up to 2; they settle on 2.
    live = await detached(waiting_request(run_id, tmp_path), recorder)
    with connect(live, versions=(1, 2, 3)) as raw:
        assert (await read_line(raw))["v"] == 2
    monkeypatch.setattr(supervision, "PROTOCOL_VERSIONS", (1, 2, 3))

    async def on_event(event: RunEvent) -> None:
        if isinstance(event, ToolResult):
            release(tmp_path)

    report = await attach_claude(waiting_request(run_id, tmp_path), live, on_event)
    assert report.status is RunStatus.SUCCEEDED
    assert claude_starts(tmp_path) == 1


async def test_detach_then_attach_follows_the_same_claude_to_its_answer(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # A state directory deep enough that the socket's path exceeds what
    # sockaddr_un holds (107 bytes): bound and reached relative to the run directory.
    state_dir = tmp_path / ("d" * 60) / ("e" * 60)
    request = waiting_request(
        run_id, tmp_path, state_dir=state_dir, switches={"result": "THE-ANSWER"}
    )
    first_positions = Positions(recorder)
    task = asyncio.create_task(
        run_claude(request, recorder, on_position=first_positions, detach=lambda: True)
    )
    await recorder.wait_for(ToolResult)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (spawned,) = recorder.of(Spawned)
    live = spawned.live
    assert live is not None
    assert len(str(Path(live.run_dir) / "sock").encode()) > 108
    assert alive([live.claude_pid, live.supervisor_pid]) == [live.claude_pid, live.supervisor_pid]
    assert not recorder.of(Result)

    again = Recorder()
    positions = Positions(again)

    async def on_event(event: RunEvent) -> None:
        await again(event)
        if isinstance(event, ToolResult):
            release(tmp_path)  # only now: the rest of the run comes live

    report = await attach_claude(replace(request, prompt=""), live, on_event, on_position=positions)
    assert report.status is RunStatus.SUCCEEDED
    assert report.result_text == "THE-ANSWER"
    assert report.exit_code == 0
    # The same claude: one process ran, to its end.
    assert claude_starts(tmp_path) == 1
    assert again.events[0] == Spawned(live.claude_pid, live)
    # Everything is handed on again, from the start; the offsets tell which
    # events the first bridge had shown already.
    shown = [e for e in recorder.events if not isinstance(e, Spawned)]
    assert again.events[1 : 1 + len(shown)] == shown
    assert positions.offsets[: len(first_positions.offsets)] == first_positions.offsets
    assert len(again.of(Result)) == 1
    await until_exited([live.supervisor_pid])
    assert_nothing_left(run_id, tmp_path)


async def test_attach_to_a_run_that_finished_while_detached(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    live = await detached(waiting_request(run_id, tmp_path), recorder)
    release(tmp_path)
    await until_exited([live.supervisor_pid])

    again = Recorder()
    report = await attach_claude(waiting_request(run_id, tmp_path), live, again)
    assert report.status is RunStatus.SUCCEEDED
    assert report.result_text == "Done."
    assert report.exit_code == 0
    assert [type(e) for e in again.events][-1] is Result
    assert claude_starts(tmp_path) == 1
    assert_nothing_left(run_id, tmp_path)


@pytest.mark.parametrize("steps", [1, 2, 3, 5, 8])
async def test_a_stop_during_the_attach_stops_the_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder, steps: int
) -> None:
    # A !stop right after a restart can cancel the attach while it connects,
    # reads the welcome or replays: wherever it lands, the run is stopped.
    request = waiting_request(run_id, tmp_path, switches={"grandchild": "1"})
    live = await detached(request, recorder)
    run = record(tmp_path)
    pids = [live.supervisor_pid, run["pid"], *run["children"]]
    attached = Recorder()
    task = asyncio.create_task(attach_claude(request, live, attached, detach=lambda: False))
    for _ in range(steps):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert alive(pids) == []
    assert pids_with_marker(run_id) == []
    # claude never answered: stopped hard, or (once attached) interrupted, which
    # ends its turn with an error result.
    assert not [e for e in attached.events if isinstance(e, Result) and not e.is_error]


async def test_a_killed_supervisor_is_reported_interrupted_and_its_run_swept(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = waiting_request(run_id, tmp_path, switches={"grandchild": "1", "background": "1"})
    live = await detached(request, recorder)
    run = record(tmp_path)
    pids = [run["pid"], *run["children"]]
    assert alive(pids) == pids
    os.kill(live.supervisor_pid, signal.SIGKILL)
    await until_exited([live.supervisor_pid])

    report = await attach_claude(request, live, Recorder())
    assert report.status is RunStatus.INTERRUPTED
    assert report.error == "the run's supervisor was gone when chatbridge restarted"
    assert alive(pids) == []
    assert pids_with_marker(run_id) == []


async def test_an_unreadable_journal_is_reported_interrupted(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    live = await detached(waiting_request(run_id, tmp_path), recorder)
    os.kill(live.supervisor_pid, signal.SIGKILL)
    await until_exited([live.supervisor_pid])
    (Path(live.run_dir) / "journal").unlink()

    report = await attach_claude(waiting_request(run_id, tmp_path), live, Recorder())
    assert report.status is RunStatus.INTERRUPTED
    assert "gone when chatbridge restarted" in report.error
    assert_nothing_left(run_id, tmp_path)


async def test_the_orphan_timeout_stops_a_run_no_bridge_attached_to(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = waiting_request(
        run_id, tmp_path, orphan_timeout_s=1.0, switches={"grandchild": "1", "ignore_term": "1"}
    )
    request = replace(request, stop_grace_s=0.5)
    live = await detached(request, recorder)
    run = record(tmp_path)
    await until_exited([live.supervisor_pid, run["pid"], *run["children"]])
    assert_nothing_left(run_id, tmp_path)
    heads = [head for head, _, _ in records(journal(live))]
    assert {"t": "expired", "status": "orphaned"} in heads

    report = await attach_claude(request, live, Recorder())
    assert report.status is RunStatus.INTERRUPTED
    assert "no chatbridge was attached to it for 1 s" in report.error


LIMITS = {
    "run_timeout": ({"run_timeout_s": 2.0}, RunStatus.TIMED_OUT, "time limit of 2 s"),
    "idle_timeout": ({"idle_timeout_s": 1.5}, RunStatus.STALLED, "no output from claude for 1.5 s"),
}


@pytest.mark.parametrize("case", LIMITS.values(), ids=LIMITS.keys())
async def test_time_limits_are_kept_while_detached(
    run_id: RunId,
    tmp_path: Path,
    recorder: Recorder,
    case: tuple[dict[str, float], RunStatus, str],
) -> None:
    limit, status, error = case
    request = replace(waiting_request(run_id, tmp_path, **limit), stop_grace_s=0.5)
    live = await detached(request, recorder)
    await until_exited([live.supervisor_pid])
    assert_nothing_left(run_id, tmp_path)

    report = await attach_claude(request, live, Recorder())
    assert report.status is status
    assert error in report.error
    assert report.session_id is not None  # from the journal's init line


async def test_the_spool_cap_keeps_the_result_line(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    cap = 4096
    request = make_request(
        run_id,
        tmp_path,
        env=fake_env(tmp_path, huge=str(200_000), stderr="e" * 20_000, result="KEPT"),
        state_dir=tmp_path / "state",
        spool_max_bytes=cap,
    )
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.SUCCEEDED
    assert report.result_text == "KEPT"
    (spawned,) = recorder.of(Spawned)
    assert spawned.live is not None
    data = journal(spawned.live)
    heads = [head for head, _, _ in records(data)]
    dropped = [head for head in heads if head["t"] == "dropped"]
    assert sum(head["out"] for head in dropped) > 200_000
    assert len(data) < cap + 20_000 + 8192 + 4096  # the cap, one chunk past it, the tail
    assert heads[-1]["t"] == "done"
    # stderr filled the cap early: the prompt's echo, which the run's end waits
    # for, came after and was kept all the same.
    (echo_end,) = [end for h, p, end in records(data) if h["t"] == "out" and b"isReplay" in p]
    assert echo_end > cap


async def test_the_spool_cap_keeps_the_end_of_stderr(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = make_request(
        run_id,
        tmp_path,
        env=fake_env(tmp_path, huge=str(200_000), exit="3"),
        state_dir=tmp_path / "state",
        spool_max_bytes=4096,
    )
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.FAILED
    assert report.exit_code == 3
    # Written once the cap was reached: kept as the tail, journaled at claude's exit.
    assert "fake claude failure" in report.error


async def test_stdin_records_reach_claude_in_order(tmp_path: Path) -> None:
    """The supervisor alone, driven over its inherited connection: stdin, eof, the journal."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    cat = tmp_path / "cat-claude"
    cat.write_text("#!/bin/sh\nexec cat\n")
    cat.chmod(0o755)
    ours, theirs = socket.socketpair()
    pieces = [b'{"a":', b'1}\n{"b"', b":2}\n"]
    with ours:
        ours.sendall(b'{"t":"attach","v":[1],"offset":0}\n')
        for piece in pieces:
            ours.sendall(b'{"t":"stdin","n":%d}\n%s' % (len(piece), piece))
        ours.sendall(b'{"t":"eof"}\n')
        with theirs:
            proc = await asyncio.create_subprocess_exec(
                *bare_argv(str(SUPERVISOR)),
                "--run-id=stdin-test", f"--run-dir={run_dir}", f"--cwd={tmp_path}",
                f"--conn-fd={theirs.fileno()}", "--grace-s=1", "--run-timeout-s=60",
                "--idle-timeout-s=60", "--orphan-timeout-s=60",
                "--spool-max-bytes=1000000", "--max-line-bytes=1000000",
                "--", str(cat),
                pass_fds=(theirs.fileno(),),
            )  # fmt: skip
        data = await read_to_end(ours)
    assert await proc.wait() == 0
    welcome, _, rest = data.partition(b"\n")
    assert json.loads(welcome)["t"] == "welcome"
    heads = [(head, payload) for head, payload, _ in records(rest)]
    out = b"".join(payload for head, payload in heads if head["t"] == "out")
    assert out == b"".join(pieces)
    kinds = [head["t"] for head, _ in heads]
    assert kinds.index("stdin_closed") < kinds.index("exited")
    assert not (run_dir / "sock").exists()  # removed with the run's end


async def test_stray_runs_are_stopped_and_removed(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = waiting_request(run_id, tmp_path, switches={"grandchild": "1"})
    live = await detached(request, recorder)
    state_dir = tmp_path / "state"
    known = state_dir / "runs" / "known-run"
    known.mkdir()
    assert stray_runs(state_dir, {"known-run"}) == [Path(live.run_dir)]

    assert await clean_stray_runs(state_dir, {"known-run"}) >= 0
    assert not Path(live.run_dir).exists()
    assert known.exists()
    await until_exited([live.supervisor_pid])
    assert_nothing_left(run_id, tmp_path)


async def test_a_stop_signal_to_the_supervisor_stops_the_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = waiting_request(run_id, tmp_path, switches={"grandchild": "1"})
    live = await detached(request, recorder)
    run = record(tmp_path)
    os.kill(live.supervisor_pid, signal.SIGHUP)
    await until_exited([live.supervisor_pid, run["pid"], *run["children"]])
    assert_nothing_left(run_id, tmp_path)
    heads = [head for head, _, _ in records(journal(live))]
    assert {"t": "stopping", "why": "signal"} in heads
    assert heads[-1] == {"t": "done", "survivors": []}

    report = await attach_claude(request, live, Recorder())
    assert report.status is RunStatus.FAILED
    assert report.exit_code == 143  # claude's own SIGTERM exit, as the real one


async def test_a_run_stopped_for_want_of_a_bridge_reports_what_claude_spent(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    """Found in the review of issue 25's run endings."""
    # No bridge attached for orphan_timeout_s: the supervisor ends the run as at its
    # other limits, claude interrupted first, so the bridge that reattaches later
    # reads the cost of the interrupted turn (SIGTERM alone prints no result: unknown).
    request = replace(waiting_request(run_id, tmp_path, orphan_timeout_s=1.0), stop_grace_s=5.0)
    live = await detached(request, recorder)
    run = record(tmp_path)
    async with asyncio.timeout(WAIT_S):
        await until_exited([live.supervisor_pid, run["pid"]])
    report = await attach_claude(request, live, Recorder())
    assert report.status is RunStatus.INTERRUPTED
    assert "no chatbridge was attached to it for 1 s" in report.error
    assert report.cost_usd is not None

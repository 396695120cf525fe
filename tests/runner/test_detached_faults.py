"""Detached runs when something goes wrong between the bridge and the supervisor.

The connection ends before ``done`` although the run went on or finished
(claude left the prompt unread, a slow bridge, a second ``attach``); a
supervisor that is frozen or speaks another protocol version; a journal with
a malformed record; a run directory someone tampered with. Real processes,
as in test_detached.py; a fake claude is a small script where the fault needs
one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from bridge.core.model import LiveRun, RunId, RunStatus
from runner import (
    AssistantText,
    RunEvent,
    Spawned,
    ToolResult,
    attach_claude,
    run_claude,
    supervision,
)
from runner.rundir import make_run_dir
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
from tests.runner.fake_runs import assert_nothing_left, make_request

pytestmark = pytest.mark.slow

SESSION = "11111111-2222-3333-4444-555555555555"


def result_line(text: str = "ANSWER") -> str:
    return json.dumps({
        "type": "result", "subtype": "success", "is_error": False, "duration_ms": 1,
        "num_turns": 1, "session_id": SESSION, "result": text, "total_cost_usd": 0.0,
    })  # fmt: skip


def assistant_line(text: str) -> str:
    return json.dumps({
        "type": "assistant", "session_id": SESSION, "parent_tool_use_id": None,
        "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
    })  # fmt: skip


def script(tmp_path: Path, body: str) -> str:
    """A fake claude: ``body`` run by this Python."""
    path = tmp_path / "myclaude"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


# --- the connection ends before done: the journal's file has the rest ---------


# Bigger than the pipe and socket buffers; below max_line_bytes (16 MiB): a longer prompt
# is refused up front, its echo could not be read (runner.control.MessageTooLong).
@pytest.mark.parametrize("size", [300_000, 4_000_000, 12_000_000])
async def test_an_answer_is_kept_when_claude_leaves_the_prompt_unread(
    run_id: RunId, tmp_path: Path, size: int
) -> None:
    # claude answers and exits without reading stdin: the supervisor finishes
    # with part of the prompt unread, which used to reset the connection and
    # lose the answer ("the run's supervisor was killed", or at the start
    # "exited with 0").
    claude = script(tmp_path, f"import sys\nsys.stdout.write({result_line()!r} + '\\n')\n")
    request = make_request(
        run_id, tmp_path, prompt="p" * size, claude_bin=claude, state_dir=tmp_path / "state"
    )
    report = await run_claude(request, Recorder())
    assert report.status is RunStatus.SUCCEEDED, report
    assert report.result_text == "ANSWER"
    assert pids_with_marker(run_id) == []


async def test_a_failure_before_reading_a_big_prompt_keeps_its_stderr(
    run_id: RunId, tmp_path: Path
) -> None:
    claude = script(tmp_path, "import sys\nsys.stderr.write('Invalid API key\\n')\nsys.exit(1)\n")
    request = make_request(
        run_id, tmp_path, prompt="p" * 10_000_000, claude_bin=claude, state_dir=tmp_path / "state"
    )
    report = await run_claude(request, Recorder())
    assert report.status is RunStatus.FAILED
    assert report.exit_code == 1
    assert "Invalid API key" in report.error


async def test_a_bridge_slower_than_the_done_linger_still_gets_the_answer(
    run_id: RunId, tmp_path: Path
) -> None:
    # More output than the socket holds; the bridge stalls on its first event
    # until the supervisor has given up on it (its linger) and exited.
    claude = script(
        tmp_path,
        f"""
        import sys
        sys.stdin.readline()  # the prompt: one user message
        sys.stdout.write(({assistant_line("x" * 4000)!r} + "\\n") * 1000)
        sys.stdout.write({result_line()!r} + "\\n")
    """,
    )
    request = make_request(run_id, tmp_path, claude_bin=claude, state_dir=tmp_path / "state")
    texts = 0
    supervisor: list[int] = []

    async def slow(event: RunEvent) -> None:
        nonlocal texts
        if isinstance(event, Spawned):
            assert event.live is not None
            supervisor.append(event.live.supervisor_pid)
        if isinstance(event, AssistantText):
            if texts == 0:
                await until_exited(supervisor)
            texts += 1

    report = await run_claude(request, slow)
    assert report.status is RunStatus.SUCCEEDED, report
    assert texts == 1000


# --- a second attach takes our connection over ----------------------------------


async def test_a_taken_over_connection_is_attached_again_not_killed(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    task = asyncio.create_task(run_claude(waiting_request(run_id, tmp_path), recorder))
    await recorder.wait_for(ToolResult)
    (spawned,) = recorder.of(Spawned)
    assert spawned.live is not None
    with connect(spawned.live) as second:  # takes over; the first bridge attaches again
        assert (await read_line(second))["t"] == "welcome"
        assert await read_to_end(second)  # closed once the first bridge is back
    assert alive([spawned.live.supervisor_pid]) == [spawned.live.supervisor_pid]
    release(tmp_path)
    report = await task
    assert report.status is RunStatus.SUCCEEDED, report
    assert len(recorder.of(ToolResult)) == 1  # the rest, not the journal again
    assert_nothing_left(run_id, tmp_path)


async def test_a_taken_over_connection_waits_for_the_run_when_it_cannot_attach_again(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    task = asyncio.create_task(run_claude(waiting_request(run_id, tmp_path), recorder))
    await recorder.wait_for(ToolResult)
    (spawned,) = recorder.of(Spawned)
    live = spawned.live
    assert live is not None
    # Connected, then the socket's name removed, then the takeover: no way back in.
    dirfd = os.open(live.run_dir, os.O_PATH | os.O_DIRECTORY)
    try:
        second = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        second.connect(f"/proc/self/fd/{dirfd}/sock")
    finally:
        os.close(dirfd)
    with second:
        os.unlink(Path(live.run_dir) / "sock")
        second.sendall(b'{"t":"attach","v":[1],"offset":0}\n')
        assert (await read_line(second))["t"] == "welcome"
        second.sendall(EOF)  # claude's input ends (the attached bridge's part)
        release(tmp_path)
        data = await read_to_end(second)
    assert [head["t"] for head, _, _ in records(data)][-1] == "done"
    report = await task  # from the journal's file, once the supervisor exited
    assert report.status is RunStatus.SUCCEEDED, report
    assert report.exit_code == 0
    assert_nothing_left(run_id, tmp_path)


# --- a supervisor that does not answer, or refuses our protocol ------------------


async def test_attach_to_a_frozen_supervisor_stops_the_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervision, "WELCOME_S", 1.0)
    request = waiting_request(run_id, tmp_path, switches={"grandchild": "1"})
    live = await detached(request, recorder)
    os.kill(live.supervisor_pid, signal.SIGSTOP)
    report = await asyncio.wait_for(attach_claude(request, live, Recorder()), 30)
    assert report.status is RunStatus.INTERRUPTED
    assert "did not answer within 1 s" in report.error
    await until_exited([live.supervisor_pid, live.claude_pid])
    assert_nothing_left(run_id, tmp_path)


async def test_a_start_whose_supervisor_says_nothing_fails_and_is_killed(
    run_id: RunId, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervision, "WELCOME_S", 1.0)
    pidfile = tmp_path / "pid"
    mute = [
        sys.executable,
        "-c",
        f"import os,time; open({str(pidfile)!r},'w').write(str(os.getpid())); time.sleep(60)",
    ]
    monkeypatch.setattr(supervision, "supervisor_argv", lambda *a, **k: mute)
    request = make_request(run_id, tmp_path, state_dir=tmp_path / "state")
    report = await asyncio.wait_for(run_claude(request, Recorder()), 30)
    assert report.status is RunStatus.FAILED
    assert "did not say claude runs within 1 s" in report.error
    assert alive([int(pidfile.read_text())]) == []


async def test_a_supervisor_refusing_our_protocol_is_stopped(
    run_id: RunId, tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = waiting_request(run_id, tmp_path, switches={"grandchild": "1"})
    live = await detached(request, recorder)
    monkeypatch.setattr(supervision, "PROTOCOL_VERSIONS", (99,))  # after a downgrade, say
    report = await attach_claude(request, live, Recorder())
    assert report.status is RunStatus.INTERRUPTED
    assert report.error == (
        "the run's supervisor speaks protocol version(s) [1, 2], this bridge [99], "
        "so the run was stopped"
    )
    await until_exited([live.supervisor_pid, live.claude_pid])
    assert_nothing_left(run_id, tmp_path)
    assert {"t": "stopping", "why": "signal"} in [h for h, _, _ in records(journal(live))]


# --- the journal's content --------------------------------------------------------


@pytest.mark.parametrize("cap", [64 * 1024 * 1024, 65536])
async def test_a_last_result_line_without_newline_is_kept_over_the_cap(
    run_id: RunId, tmp_path: Path, cap: int
) -> None:
    claude = script(
        tmp_path,
        f"""
        import sys
        sys.stdin.readline()  # the prompt: one user message
        sys.stdout.write(({assistant_line("x" * 1000)!r} + "\\n") * 200)
        sys.stdout.write({result_line()!r})  # no newline: then claude exits
    """,
    )
    request = make_request(
        run_id, tmp_path, claude_bin=claude, state_dir=tmp_path / "state", spool_max_bytes=cap
    )
    report = await run_claude(request, Recorder())
    assert report.status is RunStatus.SUCCEEDED, report
    assert report.result_text == "ANSWER"


@pytest.mark.parametrize(
    "bad",
    [b"[1]\n", b"null\n", b'{"t":"exited","code":"x"}\n', b'{"t":"done","survivors":5}\n'],
)
async def test_a_malformed_journal_record_ends_the_journal(
    run_id: RunId, tmp_path: Path, bad: bytes
) -> None:
    run_dir = tmp_path / "state" / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "journal").write_bytes(
        b'{"t":"hello","v":1,"run":"x","pid":1,"start":1}\n'
        b'{"t":"spawned","pid":999999,"cgroup":null,"cgroup_error":""}\n' + bad
    )
    live = LiveRun(
        run_id=run_id, supervisor_pid=999998, supervisor_start=1, claude_pid=999999,
        run_dir=str(run_dir), host=socket.gethostname(),
    )  # fmt: skip
    request = make_request(run_id, tmp_path, state_dir=tmp_path / "state", run_timeout_s=600)
    report = await asyncio.wait_for(attach_claude(request, live, Recorder()), 10)
    assert report.status is RunStatus.INTERRUPTED
    assert report.error == "the run's supervisor was gone when chatbridge restarted"


# --- the run directory --------------------------------------------------------------


def test_a_planted_runs_symlink_is_refused(run_id: RunId, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (state / "runs").symlink_to(elsewhere)
    with pytest.raises(OSError, match="not a directory"):
        make_run_dir(state, run_id)
    assert list(elsewhere.iterdir()) == []


def test_a_lax_state_dir_is_made_private_and_a_run_dir_is_new(
    run_id: RunId, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    (state / "runs").mkdir()
    (state / "runs").chmod(0o755)
    run_dir = make_run_dir(state, run_id)
    assert [p.stat().st_mode & 0o777 for p in (state, state / "runs", run_dir)] == [0o700] * 3
    with pytest.raises(FileExistsError):
        make_run_dir(state, run_id)
    os.rmdir(run_dir)
    run_dir.symlink_to(tmp_path)
    with pytest.raises(FileExistsError):
        make_run_dir(state, run_id)

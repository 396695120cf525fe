"""run_claude against real processes: the fake claude from tests/fakes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus, SessionId
from runner import (
    AssistantText,
    Init,
    MessageTaken,
    Result,
    RunEvent,
    Spawned,
    ToolResult,
    ToolUse,
    answer_report,
    run_claude,
)
from runner.journal import JOURNAL
from runner.rundir import RUNS
from tests.runner.conftest import Recorder, is_alive, pids_with_marker
from tests.runner.fake_runs import assert_nothing_left, fake_env, make_request, record

pytestmark = pytest.mark.slow
WAIT_S = 30.0

TRICKY_PROMPT = (
    "hello $(rm -rf ~) `id` ; | & > out\n'single' \"double\" \\ 日本語 ✓ 🚀\n\n--help -p"
)


async def test_success_events_in_order(run_id: RunId, tmp_path: Path, recorder: Recorder) -> None:
    report = await run_claude(make_request(run_id, tmp_path, env=fake_env(tmp_path)), recorder)

    assert report.status is RunStatus.SUCCEEDED
    assert report.exit_code == 0
    assert report.error == ""
    # The prompt's echo (MessageTaken) comes where claude takes it: checked alone.
    shown = [e for e in recorder.events if not isinstance(e, MessageTaken)]
    kinds = [type(e) for e in shown]
    assert kinds == [Spawned, Init, AssistantText, ToolUse, ToolResult, AssistantText, Result]
    assert len(recorder.of(MessageTaken)) == 1
    spawned, init, _, tool_use, tool_result, _, result = shown
    assert isinstance(spawned, Spawned)
    assert spawned.pid == record(tmp_path)["pid"]
    assert isinstance(init, Init)
    assert init.cwd == str(tmp_path)
    assert "Bash" in init.tools
    assert isinstance(tool_use, ToolUse)
    assert tool_use == ToolUse(tool_use.id, "Bash", {"command": "echo hello"})
    assert tool_result == ToolResult(tool_use.id, "hello", False)
    assert isinstance(result, Result)
    assert report.session_id == init.session_id == result.session_id
    assert report.result_text == "Done."
    assert report.num_turns == 1
    assert report.cost_usd == pytest.approx(0.0123)
    assert report.duration_ms == 12
    assert_nothing_left(run_id, tmp_path)


async def test_prompt_reaches_stdin_verbatim_and_never_argv(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = make_request(run_id, tmp_path, TRICKY_PROMPT, env=fake_env(tmp_path, echo="1"))
    report = await run_claude(request, recorder)

    assert report.status is RunStatus.SUCCEEDED
    assert report.result_text == TRICKY_PROMPT
    rec = record(tmp_path)
    assert rec["prompt"] == TRICKY_PROMPT
    assert all("rm -rf" not in arg for arg in rec["argv"])
    assert rec["argv"][-1] == "--"


async def test_large_prompt_and_large_output_do_not_deadlock(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # 3 MB each way: more than any pipe buffer, so both directions must flow at once.
    prompt = "ab\n" * 1_000_000
    request = make_request(run_id, tmp_path, prompt, env=fake_env(tmp_path, echo="1"))
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.SUCCEEDED
    assert report.result_text == prompt


async def test_environment_and_argv_of_the_child(
    run_id: RunId, tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDECODE", "1")
    request = make_request(
        run_id,
        tmp_path,
        env={**fake_env(tmp_path), "EXTRA_VAR": "x"},
        session_id=SessionId("5b3c6a8e-0000-4000-8000-000000000001"),
        allowed_tools=("Bash(git *)", "Edit"),
        model="opus",
        max_turns=3,
    )
    report = await run_claude(request, recorder)

    assert report.status is RunStatus.SUCCEEDED
    rec = record(tmp_path)
    assert rec["env"]["CHATBRIDGE_RUN_MARKER"] == run_id
    assert rec["env"]["EXTRA_VAR"] == "x"
    assert "CLAUDECODE" not in rec["env"]
    assert "--resume=5b3c6a8e-0000-4000-8000-000000000001" in rec["argv"]
    assert rec["cwd"] == str(tmp_path)
    assert report.session_id == SessionId("5b3c6a8e-0000-4000-8000-000000000001")


async def test_resume_continues_a_known_session(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    env = fake_env(tmp_path, sessions_dir=str(tmp_path / "sessions"))
    first = await run_claude(make_request(run_id, tmp_path, env=env), recorder)
    assert first.session_id is not None
    second = await run_claude(
        make_request(run_id, tmp_path, env=env, session_id=first.session_id), recorder
    )
    assert second.status is RunStatus.SUCCEEDED
    assert second.session_id == first.session_id
    assert second.num_turns == 2


async def test_unknown_session_is_reported(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    env = fake_env(tmp_path, sessions_dir=str(tmp_path / "sessions"))
    request = make_request(run_id, tmp_path, env=env, session_id=SessionId("no-such-session"))
    report = await run_claude(request, recorder)

    assert report.status is RunStatus.FAILED
    assert report.session_not_found
    assert report.session_id is None
    assert report.exit_code == 1
    assert "no-such-session" in report.error


async def test_missing_binary(run_id: RunId, tmp_path: Path, recorder: Recorder) -> None:
    request = make_request(run_id, tmp_path, claude_bin="/nonexistent/claude")
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.FAILED
    assert report.error.startswith("claude binary not found: /nonexistent/claude")
    assert recorder.events == []


async def test_missing_working_directory(run_id: RunId, tmp_path: Path, recorder: Recorder) -> None:
    report = await run_claude(make_request(run_id, tmp_path, cwd=tmp_path / "gone"), recorder)
    assert report.status is RunStatus.FAILED
    assert report.error.startswith("working directory not found")


async def test_invalid_request_fails_without_spawning(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    report = await run_claude(make_request(run_id, tmp_path, allowed_tools=("-x",)), recorder)
    assert report.status is RunStatus.FAILED
    assert "invalid tool rule" in report.error
    assert recorder.events == []


async def test_non_zero_exit_without_result(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    report = await run_claude(
        make_request(run_id, tmp_path, env=fake_env(tmp_path, exit="3")), recorder
    )
    assert report.status is RunStatus.FAILED
    assert report.exit_code == 3
    assert "code 3 without a result" in report.error
    assert "fake claude failure" in report.error
    assert report.session_id is not None  # from the init line


async def test_is_error_result(run_id: RunId, tmp_path: Path, recorder: Recorder) -> None:
    request = make_request(run_id, tmp_path, env=fake_env(tmp_path, is_error="1"))
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.FAILED
    assert report.exit_code == 1
    assert "error_during_execution" in report.error
    assert "fake error" in report.error


async def test_stream_json_needs_verbose_like_the_real_cli(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # The fake refuses an unknown flag: the error reaches the report via stderr.
    request = make_request(run_id, tmp_path, extra_args=("--no-such-flag",))
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.FAILED
    assert "unknown option '--no-such-flag'" in report.error


async def test_huge_line_within_cap(run_id: RunId, tmp_path: Path, recorder: Recorder) -> None:
    request = make_request(run_id, tmp_path, env=fake_env(tmp_path, huge=str(3 * 1024 * 1024)))
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.SUCCEEDED
    assert any(
        isinstance(e, AssistantText) and len(e.text) == 3 * 1024 * 1024 for e in recorder.events
    )


async def test_line_over_cap_fails_the_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = make_request(
        run_id, tmp_path, env=fake_env(tmp_path, huge="200000"), max_line_bytes=100_000
    )
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.FAILED
    assert "longer than 100000 bytes" in report.error
    assert not recorder.of(Result)
    assert_nothing_left(run_id, tmp_path)


async def test_garbage_fails_the_run(run_id: RunId, tmp_path: Path, recorder: Recorder) -> None:
    report = await run_claude(
        make_request(run_id, tmp_path, env=fake_env(tmp_path, garbage="1")), recorder
    )
    assert report.status is RunStatus.FAILED
    assert "malformed output line" in report.error
    assert "this is not json" in report.error
    assert_nothing_left(run_id, tmp_path)


async def test_unknown_line_types_are_ignored(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    report = await run_claude(
        make_request(run_id, tmp_path, env=fake_env(tmp_path, unknown="1")), recorder
    )
    assert report.status is RunStatus.SUCCEEDED
    kinds = [type(e) for e in recorder.events if not isinstance(e, MessageTaken)]
    assert kinds == [Spawned, Init, AssistantText, ToolUse, ToolResult, AssistantText, Result]


async def test_timeout(run_id: RunId, tmp_path: Path, recorder: Recorder) -> None:
    request = make_request(
        run_id,
        tmp_path,
        env=fake_env(tmp_path, sleep="60", grandchild="1"),
        # Longer than the fake's start-up on a loaded machine, so it got going.
        run_timeout_s=2.0,
        stop_grace_s=0.5,
    )
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.TIMED_OUT
    assert "time limit of 2 s" in report.error
    assert report.session_id is not None
    assert_nothing_left(run_id, tmp_path)


async def test_stall_after_some_output(run_id: RunId, tmp_path: Path, recorder: Recorder) -> None:
    # The idle limit must exceed the fake's start-up time on a loaded machine.
    request = make_request(
        run_id, tmp_path, env=fake_env(tmp_path, sleep="60"), idle_timeout_s=1.5, stop_grace_s=0.5
    )
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.STALLED
    assert "no output from claude for 1.5 s" in report.error
    assert recorder.of(ToolResult)
    assert_nothing_left(run_id, tmp_path)


async def test_stall_before_any_output(run_id: RunId, tmp_path: Path, recorder: Recorder) -> None:
    request = make_request(
        run_id,
        tmp_path,
        env=fake_env(tmp_path, sleep_before_init="60"),
        idle_timeout_s=0.3,
        stop_grace_s=0.5,
    )
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.STALLED
    # The limit interrupts claude first (SIGINT): its interrupted result says what the
    # run cost before the run is stopped.
    assert [type(e) for e in recorder.events] == [Spawned, Result]
    assert report.cost_usd is not None
    assert pids_with_marker(run_id) == []


STOP_CASES = {
    "cooperative": {},
    "ignores_sigterm": {"ignore_term": "1"},
    "setsid_grandchild_and_background_child": {"grandchild": "1", "background": "1"},
    "everything": {"ignore_term": "1", "grandchild": "1", "background": "1"},
}


@pytest.mark.parametrize("switches", STOP_CASES.values(), ids=STOP_CASES.keys())
async def test_stop_by_cancellation_leaves_nothing(
    run_id: RunId, tmp_path: Path, recorder: Recorder, switches: dict[str, str]
) -> None:
    request = make_request(
        run_id, tmp_path, env=fake_env(tmp_path, sleep="300", **switches), stop_grace_s=0.5
    )
    task = asyncio.create_task(run_claude(request, recorder))
    await recorder.wait_for(ToolResult)  # children are started before the first line
    rec = record(tmp_path)
    assert rec["pid"] in pids_with_marker(run_id)
    assert all(is_alive(pid) for pid in rec["children"])

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert_nothing_left(run_id, tmp_path)


async def test_second_cancel_during_stop_still_stops(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = make_request(
        run_id,
        tmp_path,
        env=fake_env(tmp_path, sleep="300", ignore_term="1", grandchild="1"),
        stop_grace_s=0.5,
    )
    task = asyncio.create_task(run_claude(request, recorder))
    await recorder.wait_for(ToolResult)
    task.cancel()
    # Let the stop sequence begin, then cancel again: it is shielded.
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_nothing_left(run_id, tmp_path)


async def test_failing_callback_stops_the_run_and_propagates(run_id: RunId, tmp_path: Path) -> None:
    class Boom(Exception):
        pass

    async def on_event(event: RunEvent) -> None:
        if isinstance(event, ToolUse):
            raise Boom

    request = make_request(
        run_id, tmp_path, env=fake_env(tmp_path, sleep="300", grandchild="1"), stop_grace_s=0.5
    )
    with pytest.raises(Boom):
        await run_claude(request, on_event)
    assert_nothing_left(run_id, tmp_path)


async def test_background_child_is_swept_after_a_normal_exit(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # The background child also holds claude's stdout open after claude exits.
    request = make_request(
        run_id, tmp_path, env=fake_env(tmp_path, background="1", grandchild="1"), stop_grace_s=0.5
    )
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.SUCCEEDED
    assert report.exit_code == 0
    assert_nothing_left(run_id, tmp_path)


async def test_process_lingering_after_result_is_stopped(
    run_id: RunId, tmp_path: Path, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    request = make_request(run_id, tmp_path, env=fake_env(tmp_path, linger="300"), stop_grace_s=0.3)
    report = await run_claude(request, recorder)
    assert report.status is RunStatus.SUCCEEDED
    assert report.result_text == "Done."
    assert report.exit_code == 143  # the fake exits like the real CLI on SIGTERM
    # The outcome is what the result line alone said (what bridge.runs.executor sends
    # before claude exits), plus the exit status.
    [init], [result] = recorder.of(Init), recorder.of(Result)
    assert replace(report, exit_code=None) == answer_report(result, init)
    # Signalling through Popen would reap claude behind asyncio's back (status 255).
    assert "Unknown child process" not in caplog.text
    assert_nothing_left(run_id, tmp_path)


async def test_cancel_after_the_result_keeps_the_answer(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    """claude printed its result, then lingers: a stop then still stops it, but keeps the answer."""
    request = make_request(
        run_id,
        tmp_path,
        env=fake_env(tmp_path, result="THE-ANSWER", linger="300", no_tool="1"),
        stop_grace_s=60.0,  # the runner would wait this long for claude to exit on its own
    )
    task = asyncio.create_task(run_claude(request, recorder))
    await recorder.wait_for(Result)
    task.cancel()
    report = await task
    assert report.status is RunStatus.SUCCEEDED
    assert report.result_text == "THE-ANSWER"
    assert report.session_id is not None
    assert report.cost_usd is not None
    assert_nothing_left(run_id, tmp_path)


@pytest.mark.parametrize("asked_before_refusing", [0, 1])
async def test_nothing_starts_when_the_run_may_no_longer_start(
    run_id: RunId, tmp_path: Path, recorder: Recorder, asked_before_refusing: int
) -> None:
    # Refused at the first question (before the run directory), or at the second
    # (after it, just before the spawn): either way no claude, no directory.
    state = tmp_path / "state"
    asked: list[bool] = []

    def may_start() -> bool:
        asked.append(True)
        return len(asked) <= asked_before_refusing

    request = make_request(run_id, tmp_path, env=fake_env(tmp_path), state_dir=state)
    report = await run_claude(request, recorder, may_start=may_start)
    assert report.not_started
    assert report.status is RunStatus.INTERRUPTED
    assert len(asked) == asked_before_refusing + 1
    assert recorder.events == []
    assert not (tmp_path / "record.json").exists()
    assert not (state / "runs" / run_id).exists()
    assert pids_with_marker(run_id) == []


async def until_expired(journal: Path) -> None:
    """The supervisor journaled the time limit (and interrupted claude)."""
    while not journal.exists() or b'"t":"expired"' not in journal.read_bytes():
        await asyncio.sleep(0.05)


async def test_a_stop_during_a_time_limits_grace_leaves_no_claude_behind(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    """Found in the review of issue 25's run endings."""
    # claude does not end its turn at the limit's SIGINT: the grace period runs, and a
    # !stop (or a shutdown) then cancels the run. Returned, it must have left nothing
    # running: the room's next run would be a second claude of the conversation.
    state = tmp_path / "state"
    request = make_request(
        run_id,
        tmp_path,
        env=fake_env(tmp_path, sleep="60", ignore_int="1"),
        run_timeout_s=1,
        stop_grace_s=5.0,
        state_dir=state,
    )
    async with asyncio.timeout(WAIT_S):
        running = asyncio.create_task(run_claude(request, recorder))
        await until_expired(state / RUNS / run_id / JOURNAL)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    assert pids_with_marker(run_id) == []

"""Live runs broken the way chat text, processes and restarts break them (review b)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import (
    Allow,
    InputClosed,
    MessageTaken,
    MessageTooLong,
    PermissionAsked,
    Result,
    RunControl,
    RunEvent,
    Spawned,
    attach_claude,
    run_claude,
)
from runner.prestart import prestart
from tests.runner.conftest import Recorder, is_alive, pids_with_marker
from tests.runner.fake_runs import fake_env, make_request
from tests.runner.live_helpers import cancelled, sending_at_the_first_result
from tests.runner.real_claude import until

pytestmark = pytest.mark.slow

HALF_EMOJI = "cut \ud83d here"
"""A lone UTF-16 surrogate: what a chat's JSON (``"\\ud83d"``) decodes to, and valid JSON."""


async def test_a_lone_surrogate_reaches_claude_as_one_line(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    control = RunControl()
    on_event, _ = sending_at_the_first_result(recorder, control, HALF_EMOJI + " again")

    env = fake_env(tmp_path, echo="1", no_tool="1")
    report = await run_claude(
        make_request(run_id, tmp_path, HALF_EMOJI, env=env), on_event, control=control
    )
    assert report.status is RunStatus.SUCCEEDED, report.error
    first, second = recorder.of(Result)
    assert first.text == HALF_EMOJI
    assert second.text == HALF_EMOJI + " again"
    assert pids_with_marker(run_id) == []


async def test_a_lone_surrogate_into_a_prestarted_claude(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = make_request(run_id, tmp_path, HALF_EMOJI, env=fake_env(tmp_path, echo="1"))
    started = await prestart(request)
    assert await started.ready
    async with asyncio.timeout(30):
        report = await run_claude(request, recorder, prestarted=started)
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == HALF_EMOJI
    assert pids_with_marker(run_id) == []


async def test_a_prestarted_claude_that_died_after_ready_falls_back_to_a_cold_start(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = make_request(run_id, tmp_path, "cold", env=fake_env(tmp_path, echo="1"))
    started = await prestart(request)
    assert await started.ready
    os.kill(started.live.claude_pid, signal.SIGKILL)
    # its supervisor journals the exit and finishes
    await until(lambda: not is_alive(started.live.supervisor_pid), 10)
    async with asyncio.timeout(30):
        report = await run_claude(request, recorder, prestarted=started)
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "cold"
    assert pids_with_marker(run_id) == []


async def test_a_prestart_its_supervisor_expired_falls_back_to_a_cold_start(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # Idle longer than idle_timeout_s (a long debounce): the supervisor stopped it.
    env = fake_env(tmp_path, echo="1")
    request = make_request(run_id, tmp_path, "cold", env=env, idle_timeout_s=0.5)
    started = await prestart(request)
    assert await started.ready
    await until(lambda: not is_alive(started.live.claude_pid), 10)
    async with asyncio.timeout(30):
        report = await run_claude(request, recorder, prestarted=started)
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "cold"
    assert pids_with_marker(run_id) == []


async def test_a_message_too_long_for_the_run_is_refused_not_lost(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # claude echoes a message whole: an echo over max_line_bytes would end the run
    # unreadable, its answer the earlier turn's, the message silently unanswered.
    control = RunControl()
    refused: list[Exception] = []

    async def on_event(event: RunEvent) -> None:
        await recorder(event)
        if isinstance(event, Result) and not refused:
            try:
                control.send("y" * 100_000)
            except MessageTooLong as exc:
                refused.append(exc)

    env = fake_env(tmp_path, echo="1", no_tool="1")
    request = make_request(run_id, tmp_path, "short", env=env, max_line_bytes=64 * 1024)
    report = await run_claude(request, on_event, control=control)
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.exit_code == 0  # claude ended on the end rule's eof, not stopped
    assert len(refused) == 1
    assert isinstance(refused[0], InputClosed)  # the caller's follow-up run says why

    long = replace(request, prompt="y" * 100_000)
    report = await run_claude(long, Recorder())
    assert report.status is RunStatus.FAILED
    assert "too long" in report.error
    started = await prestart(request)
    assert await started.ready
    report = await run_claude(long, Recorder(), prestarted=started)
    assert report.status is RunStatus.FAILED
    assert "too long" in report.error
    assert not is_alive(started.live.supervisor_pid)
    assert pids_with_marker(run_id) == []


async def test_a_prestart_cancelled_while_its_run_takes_it(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # Cancelled (the batch was dropped) while run_claude waits for it to be ready: the
    # run is not cancelled by it (nobody cancelled the run), it starts cold.
    # The cold start waits for the cancel's stop: same run id, same run directory.
    env = fake_env(tmp_path, echo="1")
    request = make_request(run_id, tmp_path, "cold", env=env, state_dir=tmp_path / "state")
    started = await prestart(request)
    run = asyncio.create_task(run_claude(request, recorder, prestarted=started))
    await asyncio.sleep(0)  # run_claude waits for ready (initialize is not answered yet)
    assert not started.ready.done()
    await started.cancel()
    async with asyncio.timeout(30):
        report = await run
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "cold"
    (spawned,) = recorder.of(Spawned)
    assert spawned.pid != started.live.claude_pid
    assert Path(spawned.live.run_dir, "journal").exists()  # the cancel removed only its own
    assert not is_alive(started.live.supervisor_pid)
    assert pids_with_marker(run_id) == []


DEAF_CLAUDE = """
import json, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
first = json.loads(sys.stdin.readline())
sys.stdout.write(json.dumps({**first, "isReplay": True}) + "\\n")
sys.stdout.flush()
while True:  # never reads stdin again: no interrupt answered, no eof seen
    time.sleep(1)
"""


async def test_a_stop_of_a_claude_deaf_to_interrupt_and_term_is_bounded(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    script = tmp_path / "deaf-claude"
    script.write_text(f"#!{sys.executable}\n{DEAF_CLAUDE}")
    script.chmod(0o755)
    request = make_request(run_id, tmp_path, claude_bin=str(script), stop_grace_s=0.5)
    task = asyncio.create_task(run_claude(request, recorder))
    async with asyncio.timeout(10):
        await recorder.wait_for(MessageTaken)
    task.cancel()
    async with asyncio.timeout(30):  # gentle (interrupt, eof) then TERM, then KILL
        with pytest.raises(asyncio.CancelledError):
            await task
    assert pids_with_marker(run_id) == []


async def test_a_reattached_control_takes_no_input_its_journal_closed(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # Detached, the run's turn ended and its supervisor closed claude's stdin (claude
    # lingers). A restarted bridge that sends before its replay reached that record
    # would have the message dropped by the supervisor, and its send() returned a uuid.
    gate = tmp_path / "gate"
    env = fake_env(tmp_path, tool_wait_for=str(gate), linger="3")
    request = make_request(run_id, tmp_path, env=env, state_dir=tmp_path / "state")
    task = asyncio.create_task(run_claude(request, recorder, detach=lambda: True))
    await recorder.wait_for(MessageTaken)
    await cancelled(task)
    (spawned,) = recorder.of(Spawned)
    journal = Path(spawned.live.run_dir, "journal")
    gate.touch()
    async with asyncio.timeout(10):
        while b'"stdin_closed"' not in journal.read_bytes():
            await asyncio.sleep(0.05)
    assert is_alive(spawned.live.supervisor_pid)

    control = RunControl()
    refused: list[bool] = []

    async def on_event(event: RunEvent) -> None:
        if isinstance(event, Spawned | Result):
            try:
                control.send("too late")
            except InputClosed:
                refused.append(True)
            else:
                refused.append(False)

    async with asyncio.timeout(30):
        report = await attach_claude(
            replace(request, prompt=""), spawned.live, on_event, control=control
        )
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert refused == [True, True]
    assert pids_with_marker(run_id) == []


async def test_over_the_spool_cap_approvals_and_steering_still_work(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    control = RunControl()
    sent: list[str] = []

    async def on_event(event: RunEvent) -> None:
        await recorder(event)
        if isinstance(event, PermissionAsked):
            assert control.answer(event.request_id, Allow(event.input))
        if isinstance(event, Result) and not sent:
            sent.append(control.send("more"))

    env = fake_env(tmp_path, huge="200000", result="fine")
    request = make_request(run_id, tmp_path, env=env, approve_tools=True, spool_max_bytes=50_000)
    async with asyncio.timeout(30):
        report = await run_claude(request, on_event, control=control)
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert len(recorder.of(Result)) == 2
    assert len(recorder.of(PermissionAsked)) == 2
    assert sent[0] in [t.uuid for t in recorder.of(MessageTaken)]
    assert report.exit_code == 0
    assert pids_with_marker(run_id) == []


async def test_claude_dying_before_it_answered_a_later_message_fails_the_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # The first turn's answer was handed on (and shown); the run's report must not
    # be that answer again, as if the message sent after it had been answered.
    control = RunControl()
    sent: list[str] = []

    async def on_event(event: RunEvent) -> None:
        await recorder(event)
        if isinstance(event, Result) and not sent:
            sent.append(control.send("second"))
        if isinstance(event, MessageTaken) and event.uuid in sent:
            os.kill(recorder.of(Spawned)[0].pid, signal.SIGKILL)

    env = fake_env(tmp_path, result="first answer", no_tool="1", sleep="1")  # each turn
    request = make_request(run_id, tmp_path, env=env)
    async with asyncio.timeout(30):
        report = await run_claude(request, on_event, control=control)
    assert len(recorder.of(Result)) == 1
    assert report.status is RunStatus.FAILED
    assert "SIGKILL" in report.error
    assert pids_with_marker(run_id) == []


async def test_a_detached_run_with_folded_messages_ends_by_the_supervisors_eof(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    gate = tmp_path / "gate"
    control = RunControl()
    env = fake_env(tmp_path, tool_wait_for=str(gate), echo="1")
    request = make_request(run_id, tmp_path, "one", env=env, state_dir=tmp_path / "state")
    task = asyncio.create_task(run_claude(request, recorder, control=control, detach=lambda: True))
    await recorder.wait_for(MessageTaken)
    control.send("two")
    control.send("three")
    await asyncio.sleep(0.2)  # written (an in record each) before the bridge goes
    await cancelled(task)
    (spawned,) = recorder.of(Spawned)
    gate.touch()
    await until(lambda: not is_alive(spawned.live.supervisor_pid), 20)
    report = await attach_claude(replace(request, prompt=""), spawned.live, Recorder())
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert all(word in report.result_text for word in ("one", "two", "three"))
    assert report.exit_code == 0
    assert pids_with_marker(run_id) == []

"""Live runs with the fake claude (its two-way protocol): fast, deterministic cases.

The same ground as test_live_real.py where the fake is faithful
(tests/runner/test_protocol_conformance.py checks that): approvals, a message
folded into a running turn, control requests, a stop that keeps the session,
a reattach during a permission request, prestart.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import (
    Allow,
    ControlError,
    Deny,
    Init,
    InputClosed,
    MessageTaken,
    PermissionAsked,
    Result,
    RunControl,
    RunEvent,
    Spawned,
    attach_claude,
    run_claude,
)
from runner.prestart import prestart
from tests.fakes.fake_claude import tool_log
from tests.runner.conftest import Recorder, is_alive, pids_with_marker
from tests.runner.fake_runs import fake_env, make_request
from tests.runner.live_helpers import cancelled, sending_at_the_first_result

pytestmark = pytest.mark.slow


async def test_approvals_allow_and_deny(run_id: RunId, tmp_path: Path, recorder: Recorder) -> None:
    control = RunControl()
    decisions = iter([True, False])

    async def on_event(event: RunEvent) -> None:
        await recorder(event)
        if isinstance(event, PermissionAsked):
            if next(decisions):
                assert control.answer(event.request_id, Allow(event.input))
            else:
                assert control.answer(event.request_id, Deny("no second time"))

    env = fake_env(tmp_path, tool_log=str(tmp_path / "tools.jsonl"), result="done")
    request = make_request(run_id, tmp_path, env=env, approve_tools=True)
    first = await run_claude(request, on_event, control=control)
    assert first.status is RunStatus.SUCCEEDED, first.error
    (asked,) = recorder.of(PermissionAsked)
    assert asked.tool_name == "Bash"
    assert tool_log(tmp_path) == [asked.input]

    again = Recorder()

    async def deny(event: RunEvent) -> None:
        await again(event)
        await on_event(event)

    control = RunControl()
    second = await run_claude(replace(request, run_id=RunId(f"{run_id}-2")), deny, control=control)
    assert second.status is RunStatus.SUCCEEDED, second.error
    assert len(tool_log(tmp_path)) == 1  # denied: not run
    assert any(getattr(e, "content", "") == "no second time" for e in again.events)
    assert pids_with_marker(run_id) == []


async def test_a_message_sent_during_the_tool_is_answered_by_the_same_result(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    control = RunControl()
    # The tool runs until the next message arrives (a gate opened by the test raced it).
    env = fake_env(tmp_path, tool_until_message="1", echo="1")
    task = asyncio.create_task(
        run_claude(make_request(run_id, tmp_path, "first", env=env), recorder, control=control)
    )
    await recorder.wait_for(MessageTaken)  # the prompt is in: the turn runs its tool
    steer = control.send("second")
    report = await task
    assert report.status is RunStatus.SUCCEEDED, report.error
    (result,) = recorder.of(Result)
    assert "first" in result.text
    assert "second" in result.text
    assert steer in [e.uuid for e in recorder.of(MessageTaken)]
    with pytest.raises(InputClosed):
        control.send("third")
    assert pids_with_marker(run_id) == []


async def test_control_requests_are_answered(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    gate = tmp_path / "gate"
    control = RunControl(timeout_s=5)
    env = fake_env(tmp_path, tool_wait_for=str(gate))
    task = asyncio.create_task(
        run_claude(make_request(run_id, tmp_path, env=env), recorder, control=control)
    )
    await recorder.wait_for(MessageTaken)
    await control.set_model("claude-other-1")
    await control.set_permission_mode("acceptEdits")
    with pytest.raises(ControlError):
        await control.set_permission_mode("no-such-mode")
    gate.touch()
    report = await task
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert not await control.interrupt()  # the run is over: nothing to interrupt


async def test_interrupt_then_a_new_turn_in_the_same_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    gate = tmp_path / "gate"
    control = RunControl()
    on_event, _ = sending_at_the_first_result(recorder, control, "after the interrupt")

    env = fake_env(tmp_path, tool_wait_for=str(gate), tool_turns="1", result="fine")
    task = asyncio.create_task(
        run_claude(make_request(run_id, tmp_path, env=env), on_event, control=control)
    )
    await recorder.wait_for(MessageTaken)
    assert await control.interrupt()
    report = await task
    first, second = recorder.of(Result)
    assert first.terminal_reason == "aborted_tools"
    assert second.terminal_reason == "completed"
    assert report.status is RunStatus.SUCCEEDED, report.error  # the last result's
    assert report.exit_code == 0
    assert pids_with_marker(run_id) == []


async def test_a_stop_lets_claude_end_its_turn_and_keeps_the_session(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    gate = tmp_path / "gate"
    sessions = tmp_path / "sessions"
    env = fake_env(tmp_path, tool_wait_for=str(gate), sessions_dir=str(sessions))
    request = make_request(run_id, tmp_path, env=env, stop_grace_s=5.0)
    task = asyncio.create_task(run_claude(request, recorder))
    await recorder.wait_for(MessageTaken)
    await cancelled(task)
    (init,) = recorder.of(Init)
    (result,) = recorder.of(Result)  # the interrupted turn's: claude ended it itself
    assert result.terminal_reason == "aborted_tools"
    assert pids_with_marker(run_id) == []

    gate.touch()
    again = await run_claude(
        replace(request, run_id=RunId(f"{run_id}-2"), session_id=init.session_id), Recorder()
    )
    assert again.status is RunStatus.SUCCEEDED, again.error
    assert again.session_id == init.session_id


async def test_reattach_during_a_permission_request(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    env = fake_env(tmp_path, tool_log=str(tmp_path / "tools.jsonl"))
    request = make_request(
        run_id, tmp_path, env=env, approve_tools=True, state_dir=tmp_path / "state"
    )
    task = asyncio.create_task(run_claude(request, recorder, detach=lambda: True))
    await recorder.wait_for(PermissionAsked)
    await cancelled(task)
    (spawned,) = recorder.of(Spawned)
    control = RunControl()

    async def on_event(event: RunEvent) -> None:
        if isinstance(event, PermissionAsked):
            assert control.pending == (event,)
            assert control.answer(event.request_id, Allow(event.input))

    report = await attach_claude(
        replace(request, prompt=""), spawned.live, on_event, control=control
    )
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert len(tool_log(tmp_path)) == 1
    assert not is_alive(spawned.live.claude_pid)
    assert pids_with_marker(run_id) == []


async def test_prestart_used_and_cancelled(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    request = make_request(run_id, tmp_path, env=fake_env(tmp_path, echo="1"))
    started = await prestart(replace(request, prompt=""))
    assert await started.ready
    report = await run_claude(request, recorder, prestarted=started)
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "hi"
    assert recorder.of(Spawned)[0].pid == started.live.claude_pid

    other = replace(request, run_id=RunId(f"{run_id}-2"), state_dir=tmp_path / "state")
    cancelled = await prestart(other)
    assert await cancelled.ready
    await cancelled.cancel()
    assert pids_with_marker(other.run_id) == []
    assert not Path(cancelled.run_dir).exists()
    assert not is_alive(cancelled.live.supervisor_pid)
    assert pids_with_marker(run_id) == []

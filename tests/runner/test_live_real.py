"""Live runs with the real claude against the scripted model server (docs/live-runs.md).

Approvals through ``RunControl.answer``, steering, interrupt, a stop that
keeps the session, the supervisor's own eof for a detached run, and a
reattach in the middle of a permission request.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import (
    Allow,
    Deny,
    Init,
    InputClosed,
    MessageTaken,
    PermissionAsked,
    Result,
    RunControl,
    RunEvent,
    Spawned,
    ToolResult,
    attach_claude,
    run_claude,
)
from tests.fakes.model_server import ModelServer, Turn, claude_bin
from tests.runner.conftest import Recorder, is_alive, pids_with_marker
from tests.runner.containment import until_exited
from tests.runner.live_helpers import (
    asking,
    bash_turn,
    cancelled,
    gate,
    journal_heads,
    sending_at_the_first_result,
    until_running,
)
from tests.runner.real_claude import real_request

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]


async def test_approval_allowed_then_denied(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # Outside the working directory: claude's rules leave such a command to its host.
    allowed = tmp_path / "allowed"
    denied = tmp_path / "denied"
    script = [
        bash_turn(f"touch {allowed}"),
        bash_turn(f"touch {denied}"),
        Turn(text="One of two."),
    ]
    control = RunControl()

    async def on_event(event: RunEvent) -> None:
        await recorder(event)
        if isinstance(event, PermissionAsked):
            if event.input["command"].endswith(str(allowed)):
                assert control.answer(event.request_id, Allow(event.input))
                assert not control.answer(event.request_id, Allow(event.input))  # once
            else:
                assert control.answer(event.request_id, Deny("not this one"))

    async with ModelServer(script) as server:
        report = await run_claude(
            asking(run_id, tmp_path, server, "touch two files"), on_event, control=control
        )
        last = server.agent_requests[-1]
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "One of two."
    asked = recorder.of(PermissionAsked)
    assert [a.tool_name for a in asked] == ["Bash", "Bash"]
    assert all(a.tool_use_id and a.request_id for a in asked)
    assert allowed.exists()
    assert not denied.exists()
    assert any("not this one" in text for text in last.texts())
    assert control.pending == ()
    assert not control.accepting
    with pytest.raises(InputClosed):
        control.send("too late")
    assert pids_with_marker(run_id) == []


async def test_a_message_sent_during_a_tool_is_folded_into_the_turn(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    path, command = gate(tmp_path)
    script = [bash_turn(command), Turn(text="Both seen.")]
    control = RunControl()
    async with ModelServer(script) as server:
        task = asyncio.create_task(
            run_claude(real_request(run_id, tmp_path, server, "wait"), recorder, control=control)
        )
        await until_running(run_id, command)
        steer = control.send("also mention the weather")
        await asyncio.to_thread(path.write_text, "open\n")
        report = await task
        last = server.agent_requests[-1]
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "Both seen."
    assert len(recorder.of(Result)) == 1  # one result answers both
    assert steer in [t.uuid for t in recorder.of(MessageTaken)]
    assert "also mention the weather" in "\n".join(last.texts())
    assert pids_with_marker(run_id) == []


async def test_a_message_sent_at_a_result_gets_a_turn_of_its_own(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    control = RunControl()
    # At the first result, one more message: counted, the run goes on.
    on_event, sent = sending_at_the_first_result(recorder, control, "and one more thing")

    script = [Turn(text="First answer."), Turn(text="Second answer.")]
    async with ModelServer(script) as server:
        report = await run_claude(
            real_request(run_id, tmp_path, server, "hello"), on_event, control=control
        )
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert [r.text for r in recorder.of(Result)] == ["First answer.", "Second answer."]
    assert report.result_text == "Second answer."  # the report is the last result's
    assert sent[0] in [t.uuid for t in recorder.of(MessageTaken)]
    with pytest.raises(InputClosed):
        control.send("after the end")
    assert pids_with_marker(run_id) == []


async def test_interrupt_ends_the_turn_and_the_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    _, command = gate(tmp_path)
    script = [bash_turn(command)]
    control = RunControl()
    async with ModelServer(script) as server:
        task = asyncio.create_task(
            run_claude(real_request(run_id, tmp_path, server, "wait"), recorder, control=control)
        )
        await until_running(run_id, command)
        assert await control.interrupt()
        report = await task
    (result,) = recorder.of(Result)
    assert result.terminal_reason == "aborted_tools"
    assert report.status is RunStatus.FAILED
    assert report.session_id is not None
    assert report.exit_code == 1  # claude's own exit after an error result: the end rule's eof
    assert pids_with_marker(run_id) == []


async def test_a_stop_keeps_the_session_resumable(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    _, command = gate(tmp_path)
    script = [
        bash_turn(command, text="Waiting."),
        Turn(text="You asked me to wait on the gate."),
    ]
    async with ModelServer(script) as server:
        request = real_request(
            run_id, tmp_path, server, "wait on the gate", state_dir=tmp_path / "state"
        )
        task = asyncio.create_task(run_claude(request, recorder))
        await until_running(run_id, command)
        await cancelled(task)
        (init,) = recorder.of(Init)
        (spawned,) = recorder.of(Spawned)
        heads = [head for head, _ in journal_heads(spawned.live)]
        # claude ended its turn and exited on its own (its interrupted result: code 1),
        # before any signal.
        assert {"t": "exited", "code": 1} in heads
        assert heads.index({"t": "stdin_closed"}) < heads.index({"t": "exited", "code": 1})
        assert {"t": "stopping", "why": "exited"} in heads
        assert pids_with_marker(run_id) == []

        again = await run_claude(
            replace(
                request,
                run_id=RunId(f"{run_id}-2"),
                prompt="what did I ask?",
                session_id=init.session_id,
            ),
            Recorder(),
        )
        texts = "\n".join(server.agent_requests[-1].texts())
    assert again.status is RunStatus.SUCCEEDED, again.error
    assert again.session_id == init.session_id
    assert "wait on the gate" in texts
    assert pids_with_marker(run_id) == []


async def test_a_detached_run_ends_by_the_supervisors_own_eof(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    path, command = gate(tmp_path)
    script = [bash_turn(command), Turn(text="Gate open.")]
    async with ModelServer(script) as server:
        request = real_request(run_id, tmp_path, server, "wait", state_dir=tmp_path / "state")
        task = asyncio.create_task(run_claude(request, recorder, detach=lambda: True))
        await until_running(run_id, command)
        await cancelled(task)
        (spawned,) = recorder.of(Spawned)
        live = spawned.live
        await asyncio.to_thread(path.write_text, "open\n")
        # Nobody attached: the supervisor closes stdin after the result, claude exits.
        await until_exited([live.supervisor_pid, live.claude_pid])
    heads = journal_heads(live)
    kinds = [head["t"] for head, _ in heads]
    assert kinds[-1] == "done"
    assert {"t": "exited", "code": 0} in [head for head, _ in heads]
    assert "expired" not in kinds
    closed = kinds.index("stdin_closed")
    assert b'"Gate open."' in b"".join(p for h, p in heads[:closed] if h["t"] == "out")

    report = await attach_claude(replace(request, prompt=""), live, Recorder())
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "Gate open."
    assert pids_with_marker(run_id) == []


async def test_reattach_during_a_permission_request_rebuilds_the_control(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    done = tmp_path / "done"
    script = [
        bash_turn(f"touch {done}"),
        Turn(text="Touched."),
    ]
    async with ModelServer(script) as server:
        request = asking(run_id, tmp_path, server, "touch it", state_dir=tmp_path / "state")
        task = asyncio.create_task(
            run_claude(request, recorder, detach=lambda: True, control=RunControl())
        )
        await recorder.wait_for(PermissionAsked)
        await cancelled(task)
        (spawned,) = recorder.of(Spawned)
        (asked,) = recorder.of(PermissionAsked)

        control = RunControl()
        again = Recorder()

        async def on_event(event: RunEvent) -> None:
            await again(event)
            if isinstance(event, PermissionAsked):
                # Rebuilt from the journal: pending, and answerable by this bridge.
                assert control.pending == (event,)
                assert control.answer(event.request_id, Allow(event.input))

        report = await attach_claude(
            replace(request, prompt=""), spawned.live, on_event, control=control
        )
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "Touched."
    assert again.of(PermissionAsked) == [asked]
    assert done.exists()
    assert len(again.of(Result)) == 1
    assert any(isinstance(e, ToolResult) for e in again.events)
    ins = [json.loads(p) for h, p in journal_heads(spawned.live) if h["t"] == "in"]
    assert [i["type"] for i in ins] == ["user", "control_response"]
    assert not is_alive(spawned.live.claude_pid)
    assert pids_with_marker(run_id) == []

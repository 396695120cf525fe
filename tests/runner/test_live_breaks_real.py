"""Live runs broken the way processes and chat break them, with the real claude (review b)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import MessageTaken, PermissionAsked, Result, RunControl, run_claude
from tests.fakes.model_server import ModelServer, Turn, claude_bin
from tests.runner.conftest import Recorder, pids_with_marker
from tests.runner.live_helpers import (
    asking,
    bash_turn,
    cancelled,
    gate,
    sending_at_the_first_result,
    until_running,
)
from tests.runner.real_claude import real_request

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]


async def test_interrupt_now_then_send_ends_with_the_new_messages_answer(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    _, command = gate(tmp_path)
    script = [bash_turn(command), Turn(text="New answer.")]
    control = RunControl()
    async with ModelServer(script) as server:
        task = asyncio.create_task(
            run_claude(real_request(run_id, tmp_path, server, "wait"), recorder, control=control)
        )
        await until_running(run_id, command)
        control.interrupt_now()
        steer = control.send("forget that, say something new")
        async with asyncio.timeout(60):
            report = await task
        last = server.agent_requests[-1]
    assert [r.terminal_reason for r in recorder.of(Result)] == ["aborted_tools", "completed"]
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "New answer."
    assert steer in [t.uuid for t in recorder.of(MessageTaken)]
    assert "say something new" in "\n".join(last.texts())
    assert pids_with_marker(run_id) == []


async def test_a_stop_during_a_permission_request_leaves_nothing(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    script = [bash_turn(f"touch {tmp_path}/x")]
    async with ModelServer(script) as server:
        request = asking(run_id, tmp_path, server, "touch it")
        task = asyncio.create_task(run_claude(request, recorder))
        async with asyncio.timeout(60):
            await recorder.wait_for(PermissionAsked)
        async with asyncio.timeout(30):
            await cancelled(task)
    (result,) = recorder.of(Result)
    assert result.terminal_reason == "aborted_tools"
    assert not (tmp_path / "x").exists()
    assert pids_with_marker(run_id) == []


HOSTILE = 'line\nbreak\r\x00nul \u2028sep\u2029par \x85nel "quote" \\ \ud83d half \U0001f600'


async def test_a_hostile_message_reaches_claude_whole(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    control = RunControl()
    on_event, sent = sending_at_the_first_result(recorder, control, HOSTILE + " again")

    script = [Turn(text="First."), Turn(text="Second.")]
    async with ModelServer(script) as server:
        async with asyncio.timeout(60):
            report = await run_claude(
                real_request(run_id, tmp_path, server, HOSTILE), on_event, control=control
            )
        texts = ["\n".join(r.texts()) for r in server.agent_requests]
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert [r.text for r in recorder.of(Result)] == ["First.", "Second."]
    assert sent[0] in [t.uuid for t in recorder.of(MessageTaken)]
    assert "nul \u2028sep\u2029par \x85nel" in texts[0]
    assert "\U0001f600 again" in texts[-1]
    assert pids_with_marker(run_id) == []

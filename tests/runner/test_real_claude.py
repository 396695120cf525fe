"""The real claude binary against the scripted model server: stop, resume, detach and attach.

The model server scripts the model's answers, so the real CLI runs real
shell commands through its Bash tool, offline.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import (
    ApiRetry,
    Init,
    Result,
    Spawned,
    ToolResult,
    ToolUse,
    attach_claude,
    run_claude,
)
from tests.fakes.model_server import ModelServer, ToolCall, Turn, claude_bin, claude_env
from tests.runner.conftest import Recorder, is_alive, pids_with_marker
from tests.runner.real_claude import chatbridge_console, cmdline, marked_with, real_request, until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]


async def test_stop_leaves_no_tool_process(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # claude 2.1 refuses Bash commands built around ``sleep`` ("use Monitor"),
    # so tail -f stands in for a process that runs until it is killed.
    background = "tail -f /dev/null"
    foreground = "tail -f /etc/hostname"
    script = [
        Turn(
            tools=(ToolCall("Bash", {"command": f"{background} >/dev/null 2>&1 & echo started"}),)
        ),
        Turn(tools=(ToolCall("Bash", {"command": foreground, "timeout": 600000}),)),
    ]
    async with ModelServer(script) as server:
        task = asyncio.create_task(
            run_claude(real_request(run_id, tmp_path, server, "start things"), recorder)
        )
        await until(
            lambda: bool(marked_with(run_id, background) and marked_with(run_id, foreground))
        )
        sleepers = marked_with(run_id, background) + marked_with(run_id, foreground)
        assert any(isinstance(e, ToolResult) and "started" in e.content for e in recorder.events)

        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert pids_with_marker(run_id) == []
    assert not any(is_alive(pid) for pid in sleepers)


async def test_stop_leaves_no_tool_that_cleared_its_environment(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # ``env -i`` drops the run's marker: only the supervisor can find this one.
    pid_file = tmp_path / "escaped.pid"
    command = f"env -i sh -c 'echo $$ > {pid_file}; exec tail -f /dev/null' >/dev/null 2>&1 &"
    script = [
        Turn(tools=(ToolCall("Bash", {"command": f"{command} echo started"}),)),
        Turn(tools=(ToolCall("Bash", {"command": "tail -f /etc/hostname", "timeout": 600000}),)),
    ]
    async with ModelServer(script) as server:
        task = asyncio.create_task(
            run_claude(real_request(run_id, tmp_path, server, "start things"), recorder)
        )
        await until(lambda: pid_file.exists() and bool(pid_file.read_text().strip()))
        escaped = int(pid_file.read_text())
        await until(lambda: cmdline(escaped) == "tail -f /dev/null")
        assert escaped not in pids_with_marker(run_id)

        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert not is_alive(escaped)
    assert pids_with_marker(run_id) == []


async def test_resume_continues_the_conversation(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    script = [
        Turn(text="Let me check.", tools=(ToolCall("Bash", {"command": "echo tool-output-42"}),)),
        Turn(text="The secret word is noted."),
        Turn(text="You said pineapple."),
    ]
    async with ModelServer(script) as server:
        first = await run_claude(
            real_request(run_id, tmp_path, server, "The secret word is pineapple."), recorder
        )
        assert first.status is RunStatus.SUCCEEDED, first.error
        assert first.result_text == "The secret word is noted."
        assert first.session_id is not None
        (init,) = recorder.of(Init)
        assert init.session_id == first.session_id
        (tool_use,) = recorder.of(ToolUse)
        assert tool_use.input == {"command": "echo tool-output-42"}
        (tool_result,) = recorder.of(ToolResult)
        assert "tool-output-42" in tool_result.content
        assert len(recorder.of(Result)) == 1

        second = await run_claude(
            real_request(
                run_id, tmp_path, server, "What was the word?", session_id=first.session_id
            ),
            recorder,
        )
        assert second.status is RunStatus.SUCCEEDED, second.error
        assert second.result_text == "You said pineapple."
        assert second.session_id == first.session_id

        last = server.agent_requests[-1]
        texts = "\n".join(last.texts())
        for earlier in ("The secret word is pineapple.", "tool-output-42", "noted", "What was"):
            assert earlier in texts
    assert pids_with_marker(run_id) == []


async def test_resume_of_unknown_session(run_id: RunId, tmp_path: Path, recorder: Recorder) -> None:
    async with ModelServer([]) as server:
        report = await run_claude(
            real_request(
                run_id,
                tmp_path,
                server,
                "hello",
                session_id="0b5c1d7e-4a3f-4c2b-9d8e-7f6a5b4c3d2e",
            ),
            recorder,
        )
    assert report.status is RunStatus.FAILED
    assert report.session_not_found, report.error
    assert server.agent_requests == []


async def test_refused_key_fails_the_run_at_the_first_retry(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    """claude retries a refused key ~10 times (minutes); the run ends at its first retry line."""
    async with ModelServer([], refuse=401) as server:
        request = real_request(run_id, tmp_path, server, "hello")
        # claude_env disables retries for speed; here they are what is tested.
        request = replace(request, env={**request.env, "CLAUDE_CODE_MAX_RETRIES": "10"})
        report = await run_claude(request, recorder)
        tries = len([r for r in server.requests if r.path.endswith("/v1/messages")])
    assert report.status is RunStatus.FAILED
    assert report.error is not None
    assert report.error.startswith("claude could not authenticate: HTTP 401")
    # Stopped at the first retry line: claude had nine more tries to go.
    assert tries < 10
    assert [e.error_status for e in recorder.events if isinstance(e, ApiRetry)] == [401]
    assert not pids_with_marker(run_id)


async def test_overloaded_api_is_retried_to_claudes_own_end(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    async with ModelServer([], refuse=529) as server:
        request = real_request(run_id, tmp_path, server, "hello")
        request = replace(request, env={**request.env, "CLAUDE_CODE_MAX_RETRIES": "2"})
        report = await run_claude(request, recorder)
    assert report.status is RunStatus.FAILED
    assert "could not authenticate" not in (report.error or "")
    retries = [e for e in recorder.events if isinstance(e, ApiRetry)]
    assert [e.attempt for e in retries] == [1, 2]
    assert any(isinstance(e, Result) for e in recorder.events)


async def test_room_is_told_at_once_when_claude_cannot_authenticate(tmp_path: Path) -> None:
    """The whole path: ``chatbridge run`` (console), the real claude, an API refusing its key."""
    from tests.bridge.harness import write_config

    async with ModelServer([], refuse=401) as server:
        env = {**claude_env(server.url, tmp_path / "home"), "CLAUDE_CODE_MAX_RETRIES": "10"}
        config = write_config(tmp_path, {"runner": {"claude_bin": str(claude_bin())}}, env=env)
        returncode, out, err = await chatbridge_console(config, b"hello\n")
        tries = len([r for r in server.requests if r.path.endswith("/v1/messages")])
    assert returncode == 0, err
    assert "claude could not authenticate: HTTP 401" in out
    assert tries < 10  # the room was told before claude's retries ran out


async def test_detach_mid_tool_then_attach_gets_the_answer(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    """The bridge goes away while claude's Bash tool runs; a new one attaches and answers."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    command = f"cat {gate}"
    script = [
        Turn(tools=(ToolCall("Bash", {"command": command}),)),
        Turn(text="The gate said open."),
    ]
    async with ModelServer(script) as server:
        request = real_request(
            run_id, tmp_path, server, "open the gate", state_dir=tmp_path / "state"
        )
        task = asyncio.create_task(run_claude(request, recorder, detach=lambda: True))
        await until(lambda: bool(marked_with(run_id, command)))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        (spawned,) = recorder.of(Spawned)
        live = spawned.live
        assert live is not None
        assert is_alive(live.claude_pid)
        assert not recorder.of(Result)

        again = Recorder()
        attached = asyncio.create_task(attach_claude(replace(request, prompt=""), live, again))
        await again.wait_for(ToolUse)  # re-emitted from the journal
        await asyncio.to_thread(gate.write_text, "open\n")  # the tool ends now
        report = await attached
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "The gate said open."
    assert again.events[0] == Spawned(live.claude_pid, live)
    assert any(isinstance(e, ToolResult) and "open" in e.content for e in again.events)
    assert len(again.of(Result)) == 1
    assert pids_with_marker(run_id) == []

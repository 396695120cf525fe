"""Review of 15a746d: the run's supervisor answers claude's ``mcp_message`` control
requests for ``chatbridge`` (send_file). A scripted claude asks, the supervisor answers."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bridge.core.model import RunId, RunStatus
from runner import (
    Allow,
    Deny,
    Init,
    PermissionAsked,
    RunControl,
    RunEvent,
    Spares,
    Spawned,
    ToolResult,
    run_claude,
)
from runner.bare import bare_argv
from runner.mcp_server import QUALIFIED_TOOL
from runner.prestart import prestart
from runner.spare import SUPERVISOR
from tests.fakes.model_server import ModelServer, ToolCall, Turn, claude_bin
from tests.runner.conftest import Recorder
from tests.runner.detached_runs import records
from tests.runner.fake_runs import make_request
from tests.runner.live_helpers import asking, run_heads
from tests.runner.real_claude import real_request

pytestmark = pytest.mark.slow

# Writes the lines of ASK (a JSON list of strings) to stdout, then reads as many lines
# from stdin and prints each back as {"type": "got", "line": ...}; exits.
ASKING = """
import json, sys
asks = json.loads(sys.argv[1])
for line in asks:
    sys.stdout.write(line + "\\n")
sys.stdout.flush()
for _ in asks:
    got = sys.stdin.readline()
    sys.stdout.write(json.dumps({"type": "got", "line": got}) + "\\n")
    sys.stdout.flush()
"""


def mcp(request_id: str, message: object, server: str = "chatbridge") -> str:
    request = {"subtype": "mcp_message", "server_name": server, "message": message}
    return json.dumps({"type": "control_request", "request_id": request_id, "request": request})


async def run_asking(tmp_path: Path, asks: list[str]) -> tuple[int, list[str]]:
    """The supervisor (with ``--send-file-max-bytes``) of a claude that sends ``asks``:
    its exit code and what claude read back on its stdin, line by line."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "ok.txt").write_text("fine")
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    script = tmp_path / "claude.py"
    script.write_text(ASKING)
    ours, theirs = socket.socketpair()
    with ours:
        ours.sendall(b'{"t":"attach","v":[2],"offset":0}\n')
        with theirs:
            proc = await asyncio.create_subprocess_exec(
                *bare_argv(str(SUPERVISOR)),
                "--run-id=review-mcp", f"--run-dir={run_dir}", f"--cwd={work}",
                f"--conn-fd={theirs.fileno()}", "--grace-s=0.5", "--run-timeout-s=60",
                "--idle-timeout-s=60", "--orphan-timeout-s=60",
                "--spool-max-bytes=1000000", "--max-line-bytes=1000000",
                "--send-file-max-bytes=100",
                "--", sys.executable, "-I", str(script), json.dumps(asks),
                pass_fds=(theirs.fileno(),),
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    code = proc.returncode
    assert code is not None
    got: list[str] = []
    journal = (run_dir / "journal").read_bytes()
    for head, payload, _ in records(journal):
        if head["t"] == "out":
            for line in payload.splitlines():
                obj = json.loads(line)
                if obj.get("type") == "got":
                    got.append(obj["line"])
    assert code == 0, err.decode()
    return code, got


def answer(line: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(line)
    assert obj["type"] == "control_response"
    return obj


async def test_well_formed_requests_are_answered_in_order(tmp_path: Path) -> None:
    # Control: several requests in one read, each answered once, whole lines, in order.
    asks = [
        mcp("a", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        mcp("b", {"jsonrpc": "2.0", "method": "notifications/initialized"}),
        mcp("c", {"jsonrpc": "2.0", "id": "x", "method": "ping"}),
    ]
    _, got = await run_asking(tmp_path, asks)
    assert [answer(line)["response"]["request_id"] for line in got] == ["a", "b", "c"]


@pytest.mark.parametrize(
    "message",
    [
        # params that are not an object
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": [1]},
        # an unhashable protocolVersion
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": []}},
        # arguments that are not an object
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "send_file", "arguments": "ok.txt"},
        },
        # a path the file system cannot encode (a lone surrogate: "\\ud800" in the
        # model's tool input JSON)
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "send_file", "arguments": {"path": "\ud800.txt"}},
        },
    ],
    ids=["params-list", "version-list", "arguments-str", "lone-surrogate"],
)
async def test_an_odd_message_does_not_kill_the_supervisor(
    tmp_path: Path, message: dict[str, Any]
) -> None:
    # The stdio server this replaced died alone on such a message (claude saw its server
    # fail); inside the supervisor the exception ends the supervisor: the run's
    # journal, its relay and its clean-up go with it, claude is left without a parent.
    asks = [mcp("bad", message), mcp("good", {"jsonrpc": "2.0", "id": 2, "method": "ping"})]
    _, got = await run_asking(tmp_path, asks)
    assert [answer(line)["response"]["request_id"] for line in got] == ["bad", "good"]
    assert run_heads(tmp_path)[-1]["t"] == "done"


@pytest.mark.claude
@pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed")
async def test_the_real_claude_passes_a_lone_surrogate_through(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # What the model writes as "\ud800" in its tool input reaches the supervisor as
    # such (the CLI's JSON is well-formed UTF-16 escapes): before the fix it killed the
    # supervisor, the run ended as failed, without its tool result.
    script = [Turn(tools=(ToolCall(QUALIFIED_TOOL, {"path": "\ud800.txt"}),)), Turn(text="ok")]
    async with ModelServer(script) as server:
        request = real_request(
            run_id,
            tmp_path,
            server,
            "send it",
            permission_mode="",
            allowed_tools=(QUALIFIED_TOOL,),
            send_file_max_bytes=1000,
        )
        report = await run_claude(request, recorder)
    assert report.status is RunStatus.SUCCEEDED, report
    [result] = recorder.of(ToolResult)
    assert result.is_error
    assert result.content.startswith("not sent:")


async def test_a_relative_cwd_is_the_bridges_for_claude_and_its_tool(
    run_id: RunId, tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A room's cwd defaults to "." (docs/configuration.md): the bridge's directory, where
    # the bridge checks a sent file again (bridge/runs/file_posts.py). The supervisor works in
    # the run directory, so a relative --cwd put claude there, and (since 15a746d, the
    # tool answered by the supervisor) send_file's root too: the room's files were not
    # claude's, and a file made in the run directory was "queued" but refused after.
    work = tmp_path / "work"
    work.mkdir()
    (work / "report.txt").write_text("numbers")
    monkeypatch.chdir(work)
    request = make_request(
        run_id,
        tmp_path,
        cwd=Path(),
        allowed_tools=(QUALIFIED_TOOL,),
        send_file_max_bytes=1000,
        env={"FAKE_CLAUDE_NO_TOOL": "1", "FAKE_CLAUDE_SEND_FILE": '{"path": "report.txt"}'},
    )
    await run_claude(request, recorder)
    assert recorder.of(Init)[0].cwd == str(work)
    [result] = recorder.of(ToolResult)
    assert not result.is_error, result.content


async def test_a_spare_supervisor_answers_send_file_from_its_orders(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # Held up: the option reaches a spare through its orders (supervisor_options).
    spares = Spares()
    spares.refill()
    ready = spares._ready
    assert ready is not None
    (tmp_path / "report.txt").write_text("numbers")
    request = make_request(
        run_id,
        tmp_path,
        allowed_tools=(QUALIFIED_TOOL,),
        send_file_max_bytes=1000,
        env={"FAKE_CLAUDE_NO_TOOL": "1", "FAKE_CLAUDE_SEND_FILE": '{"path": "report.txt"}'},
    )
    try:
        await run_claude(request, recorder, spares=spares)
    finally:
        await spares.close()
    assert recorder.of(Spawned)[0].live.supervisor_pid == ready.proc.pid
    [result] = recorder.of(ToolResult)
    assert not result.is_error, result.content


@pytest.mark.claude
@pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed")
async def test_the_real_claude_with_another_sdk_server_is_not_held_up(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # Held up: another SDK server (the user's extra --mcp-config) gets error answers
    # from the supervisor; the real CLI marks it failed and the run goes on, with ours.
    other = json.dumps({"mcpServers": {"other": {"type": "sdk", "name": "other"}}})
    async with ModelServer([Turn(text="hi")]) as server:
        request = real_request(
            run_id,
            tmp_path,
            server,
            "hello",
            permission_mode="",
            allowed_tools=(),
            extra_args=("--mcp-config", other),
            run_timeout_s=60,
            idle_timeout_s=30,
            send_file_max_bytes=1000,
        )
        report = await run_claude(request, recorder)
    assert report.status is RunStatus.SUCCEEDED, report
    init = recorder.of(Init)[0]
    assert QUALIFIED_TOOL in init.tools


@pytest.mark.claude
@pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed")
async def test_a_prestarted_real_claude_sends_a_file(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # Held up: the handshake with the SDK server happens while the prestarted claude
    # waits for its prompt; the tool works in the run that takes it.
    script = [Turn(tools=(ToolCall(QUALIFIED_TOOL, {"path": "report.txt"}),)), Turn(text="ok")]
    async with ModelServer(script) as server:
        request = replace(
            real_request(run_id, tmp_path, server, "send it"),
            allowed_tools=(QUALIFIED_TOOL,),
            send_file_max_bytes=1000,
        )
        (request.cwd / "report.txt").write_text("numbers")
        started = await prestart(replace(request, prompt=""))
        assert await started.ready
        report = await run_claude(request, recorder, prestarted=started)
    assert report.status is RunStatus.SUCCEEDED, report
    assert recorder.of(Spawned)[0].pid == started.live.claude_pid
    [result] = recorder.of(ToolResult)
    assert not result.is_error
    assert result.content == "queued report.txt"


@pytest.mark.claude
@pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed")
async def test_the_real_claude_asks_before_send_file_then_the_supervisor_answers(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # Held up: send_files_need_approval with the SDK server: can_use_tool for the tool
    # (the bridge's to answer), then tools/call (the supervisor's); a denial calls nothing.
    script = [
        Turn(tools=(ToolCall(QUALIFIED_TOOL, {"path": "report.txt"}),)),
        Turn(tools=(ToolCall(QUALIFIED_TOOL, {"path": "other.txt"}),)),
        Turn(text="ok"),
    ]
    control = RunControl()

    async def on_event(event: RunEvent) -> None:
        await recorder(event)
        if isinstance(event, PermissionAsked):
            if event.input.get("path") == "report.txt":
                assert control.answer(event.request_id, Allow(event.input))
            else:
                assert control.answer(event.request_id, Deny("not that one"))

    async with ModelServer(script) as server:
        request = replace(asking(run_id, tmp_path, server, "send it"), send_file_max_bytes=1000)
        (request.cwd / "report.txt").write_text("numbers")
        (request.cwd / "other.txt").write_text("more")
        report = await run_claude(request, on_event, control=control)
    assert report.status is RunStatus.SUCCEEDED, report
    assert [a.tool_name for a in recorder.of(PermissionAsked)] == [QUALIFIED_TOOL] * 2
    first, second = recorder.of(ToolResult)
    assert (first.is_error, first.content) == (False, "queued report.txt")
    assert second.is_error
    assert "not that one" in second.content

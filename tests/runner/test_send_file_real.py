"""The real claude spawns our ``chatbridge`` MCP server from ``--mcp-config`` and calls it.

What the bridge relies on (docs/files.md): the tool is offered to the model
as ``mcp__chatbridge__send_file``; a call shows in stream-json as a
``tool_use`` with the input the model gave, followed by a ``tool_result``
carrying the server's text, ``is_error`` when the server refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import RoomSettings
from bridge.core.model import (
    Batch,
    ExternalMessageId,
    Message,
    MessageId,
    RoomId,
    RoomKey,
    RunId,
    RunStatus,
    TransportName,
    UserId,
)
from bridge.metrics import Metrics
from bridge.outbound.outbox import Outbox
from bridge.runs.file_posts import FilePosts
from bridge.store.memory import MemoryStore
from runner import Init, RunRequest, ToolResult, ToolUse, run_claude
from runner.mcp_server import QUALIFIED_TOOL
from tests.fakes.model_server import ModelServer, ToolCall, Turn, claude_bin, claude_env
from tests.runner.conftest import Recorder, pids_with_marker

ROOM = RoomKey(TransportName("console"), RoomId("console"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]


def request(run_id: RunId, tmp_path: Path, server: ModelServer, **fields: object) -> RunRequest:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return RunRequest(
        run_id=run_id,
        claude_bin=str(claude_bin()),
        cwd=work,
        prompt="send the report",
        session_id=None,
        allowed_tools=(QUALIFIED_TOOL,),
        env=claude_env(server.url, tmp_path / "home"),
        run_timeout_s=90,
        idle_timeout_s=90,
        stop_grace_s=2.0,
        **fields,  # type: ignore[arg-type]
    )


async def test_claude_calls_send_file_through_our_server(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    script = [
        Turn(
            tools=(
                ToolCall(QUALIFIED_TOOL, {"path": "report.txt", "comment": "here"}),
                ToolCall(QUALIFIED_TOOL, {"path": "../outside.txt"}),
            )
        ),
        Turn(text="sent"),
    ]
    (tmp_path / "outside.txt").write_text("secret")
    async with ModelServer(script) as server:
        req = request(run_id, tmp_path, server, send_file_max_bytes=1000)
        (req.cwd / "report.txt").write_text("numbers")
        report = await run_claude(req, recorder)

    assert report.status is RunStatus.SUCCEEDED, report
    init = recorder.of(Init)[0]
    assert QUALIFIED_TOOL in init.tools
    # (MCP tools are deferred behind ToolSearch in the request; a direct call still runs.)
    uses = {u.id: u for u in recorder.of(ToolUse)}
    results = {r.tool_use_id: r for r in recorder.of(ToolResult)}
    good, bad = recorder.of(ToolUse)
    assert good.name == QUALIFIED_TOOL
    assert good.input == {"path": "report.txt", "comment": "here"}
    assert results[good.id].content == "queued report.txt"
    assert not results[good.id].is_error
    assert bad.id in uses
    assert results[bad.id].is_error
    assert "outside the working directory" in results[bad.id].content
    assert pids_with_marker(run_id) == []  # the MCP server went with claude

    # The bridge, given these very events, records the good one's post (and only it).
    store = MemoryStore()
    posts = FilePosts(store, Outbox(store, {}, Metrics()), Metrics(), tmp_path / "state")
    room = RoomSettings(key=ROOM, cwd=req.cwd)
    message = Message(MessageId(1), ROOM, UserId("u"), "send", ExternalMessageId("m"), 0.0)
    watcher = posts.watch(run_id, Batch(ROOM, (message,)), room)
    for event in recorder.events:
        post = watcher.see(event)
        if post is not None:
            await post
    [entry] = await store.undelivered()
    assert entry.reply.text == "here"
    assert entry.reply.file is not None
    assert Path(entry.reply.file).read_text() == "numbers"

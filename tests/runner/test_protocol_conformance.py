"""The two-way protocol, the same scenarios against the real CLI and the fake.

Each scenario drives ``claude -p --input-format stream-json`` over raw pipes
(no runner code): a small driver writes NDJSON lines and reads the answers.
The real CLI runs offline against the scripted model server, with real Bash
commands; the fake is set up with its environment knobs to do the same. Both
must show the same protocol facts, so the fake the other tests use stays
faithful to the real thing.

Tool commands start with ``touch``: the real CLI runs read-only commands
(``echo``, ``cat``, ``sleep``) without asking, and these tests need it to ask.
A tool that must stay running blocks on a gate: a FIFO the real ``cat``
reads, a file the fake's ``FAKE_CLAUDE_TOOL_WAIT_FOR`` waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runner.command import mcp_config
from runner.mcp_server import QUALIFIED_TOOL
from runner.mcp_server import Server as McpServer
from runner.supervisor import mcp_reply
from tests.fakes.fake_claude import install
from tests.fakes.model_server import ModelServer, ToolCall, Turn, claude_bin, claude_env

WITHIN = 15.0
"""Bound on any one wait (the real CLI takes about a second per step when cold)."""

Line = dict[str, Any]


class Peer:
    """One claude process: NDJSON lines in, every stdout line kept in order.

    With ``mcp``, it answers claude's ``mcp_message`` requests for our server as the
    run's supervisor does, whenever it reads one.
    """

    def __init__(self, process: asyncio.subprocess.Process, mcp: McpServer | None = None) -> None:
        self.process = process
        self.lines: list[Line] = []
        self.mcp = mcp

    async def send(self, obj: Line) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(obj) + "\n").encode())
        await self.process.stdin.drain()

    async def user(self, text: str) -> str:
        """Send a user message; returns its uuid."""
        message_uuid = str(uuid.uuid4())
        message = {"role": "user", "content": text}
        await self.send({"type": "user", "message": message, "uuid": message_uuid})
        return message_uuid

    async def control(self, request_id: str, request: Line) -> Line:
        """Send a control request and return the ``response`` of its control_response."""
        await self.send({"type": "control_request", "request_id": request_id, "request": request})
        line = await self.expect(
            lambda o: (
                o.get("type") == "control_response"
                and o["response"].get("request_id") == request_id
            )
        )
        response: Line = line["response"]
        return response

    async def answer(self, request: Line, decision: Line) -> None:
        """Answer a can_use_tool request; wait for its echo (the CLI replays it)."""
        request_id = request["request_id"]
        response = {"subtype": "success", "request_id": request_id, "response": decision}
        await self.send({"type": "control_response", "response": response})
        await self.expect(
            lambda o: (
                o.get("type") == "control_response"
                and o["response"].get("request_id") == request_id
            )
        )

    async def expect(self, wanted: Callable[[Line], bool]) -> Line:
        """Read lines until one is ``wanted`` (bounded); returns it."""
        assert self.process.stdout is not None
        async with asyncio.timeout(WITHIN):
            while True:
                raw = await self.process.stdout.readline()
                if not raw:
                    raise AssertionError(f"stdout ended; lines: {self.lines}")
                try:
                    line: Line = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                self.lines.append(line)
                if self.mcp is not None and is_mcp_request(line):
                    reply = mcp_reply(line["request_id"], line["request"], self.mcp)
                    assert self.process.stdin is not None
                    self.process.stdin.write(reply)
                    await self.process.stdin.drain()
                if wanted(line):
                    return line

    async def close(self) -> int:
        """Close stdin, read stdout to its end, return the exit code."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        async with asyncio.timeout(WITHIN):
            async for raw in self.process.stdout:
                with contextlib.suppress(json.JSONDecodeError):
                    self.lines.append(json.loads(raw))
            return await self.process.wait()

    def index(self, wanted: Callable[[Line], bool]) -> int:
        """Position of the first line seen so far that is ``wanted``."""
        return next(i for i, line in enumerate(self.lines) if wanted(line))

    @property
    def results(self) -> list[Line]:
        return [line for line in self.lines if line.get("type") == "result"]


def is_result(line: Line) -> bool:
    return line.get("type") == "result"


def is_init(line: Line) -> bool:
    return line.get("type") == "system" and line.get("subtype") == "init"


def is_mcp_request(line: Line) -> bool:
    return line.get("type") == "control_request" and line["request"].get("subtype") == "mcp_message"


def is_asking(line: Line) -> bool:
    return (
        line.get("type") == "control_request" and line["request"].get("subtype") == "can_use_tool"
    )


def echo_of(message_uuid: str) -> Callable[[Line], bool]:
    return lambda o: o.get("type") == "user" and o.get("uuid") == message_uuid


def tool_results(peer: Peer) -> list[Line]:
    return [
        block
        for line in peer.lines
        if line.get("type") == "user" and isinstance(line["message"].get("content"), list)
        for block in line["message"]["content"]
        if block.get("type") == "tool_result"
    ]


@dataclass
class Claude:
    """A started claude, real or fake, and what a scenario needs to check on it."""

    kind: str
    peer: Peer
    work: Path
    gate: Path
    """Opened by ``open_gate``: a tool command ``cat``-ing it (real) or waiting for it (fake)."""
    tool_log: Path
    server: ModelServer | None = None

    async def open_gate(self) -> None:
        # A FIFO write blocks until the real tool opens it to read: off the loop.
        await asyncio.to_thread(self.gate.write_text, "open\n")

    async def tool_ran(self, marker: str) -> None:
        """Wait until the tool whose command touches ``marker`` ran (bounded poll: no event)."""

        def ran() -> bool:
            if self.kind == "real":
                return (self.work / marker).exists()
            return self.tool_log.exists() and marker in self.tool_log.read_text()

        async with asyncio.timeout(WITHIN):
            while not ran():
                await asyncio.sleep(0.02)


@dataclass
class Setup:
    """How to make both sides do one scenario."""

    script: Sequence[Turn] = ()
    """The model's answers, for the real CLI."""
    fake: dict[str, str] = field(default_factory=dict)
    """The fake's knobs for the same behaviour."""
    ask: bool = True
    """``--permission-prompt-tool stdio``."""
    send_file_limit: int | None = None
    """Give both our ``chatbridge`` MCP server (``--mcp-config``), refusing files over
    this size."""
    send_file_allowed: bool = True
    """``send_file`` in ``--allowedTools`` (else it is asked for, with ``ask``)."""


Start = Callable[[Setup], Awaitable[Claude]]


@pytest.fixture(
    params=[
        pytest.param(
            "real",
            marks=[
                pytest.mark.slow,
                pytest.mark.claude,
                pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
            ],
        ),
        "fake",
    ]
)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def start(kind: str, tmp_path: Path) -> AsyncIterator[Start]:
    async with contextlib.AsyncExitStack() as stack:
        processes: list[asyncio.subprocess.Process] = []

        async def launch(setup: Setup) -> Claude:
            work = tmp_path / "work"
            work.mkdir()
            gate = tmp_path / "gate"
            tool_log = tmp_path / "tools.jsonl"
            env = {k: v for k, v in os.environ.items() if k != "CLAUDECODE"}
            server = None
            if kind == "real":
                os.mkfifo(gate)
                server = await stack.enter_async_context(ModelServer(setup.script))
                env.update(claude_env(server.url, tmp_path / "home"))
                binary = str(claude_bin())
            else:
                env.update(setup.fake, FAKE_CLAUDE_TOOL_LOG=str(tool_log))
                if "FAKE_CLAUDE_TOOL_WAIT_FOR" in setup.fake:
                    env["FAKE_CLAUDE_TOOL_WAIT_FOR"] = str(gate)
                binary = str(install(tmp_path))
            argv = [binary, "-p", "--input-format", "stream-json", "--output-format"]
            argv += ["stream-json", "--verbose", "--replay-user-messages"]
            mcp = None
            if setup.send_file_limit is not None:
                mcp = McpServer(str(work), setup.send_file_limit)
                argv += ["--mcp-config", mcp_config()]
                if setup.send_file_allowed:
                    argv += ["--allowedTools", QUALIFIED_TOOL]
            if setup.ask:
                argv += ["--permission-prompt-tool", "stdio"]
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=work,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=16 * 1024 * 1024,
            )
            processes.append(process)
            return Claude(kind, Peer(process, mcp), work, gate, tool_log, server)

        try:
            yield launch
        finally:
            for process in processes:
                if process.returncode is None:
                    process.kill()
                    await process.wait()


def gated(marker: str, *, gate: bool = False) -> Setup:
    """One Bash tool use that touches ``marker`` (and, with a gate, blocks on it), then text."""
    command = f"touch {marker}; cat ../gate" if gate else f"touch {marker}; echo ran-42"
    fake = {"FAKE_CLAUDE_TOOL_COMMAND": command, "FAKE_CLAUDE_RESULT": "after the tool"}
    fake["FAKE_CLAUDE_TOOL_OUTPUT"] = "open" if gate else "ran-42"
    if gate:
        fake["FAKE_CLAUDE_TOOL_WAIT_FOR"] = "the gate"  # made absolute once it exists
    script = [Turn(tools=(ToolCall("Bash", {"command": command}),)), Turn(text="after the tool")]
    return Setup(script=script, fake=fake)


async def test_initialize_and_controls_before_any_message(start: Start, tmp_path: Path) -> None:
    claude = await start(
        Setup(script=[Turn(text="hello back")], fake={"FAKE_CLAUDE_NO_TOOL": "1"}, ask=False)
    )
    peer = claude.peer
    initialized = await peer.control("c1", {"subtype": "initialize"})
    # Nothing comes before the answer to initialize: no init line yet.
    assert peer.lines == [{"type": "control_response", "response": initialized}]
    assert initialized["subtype"] == "success"
    assert isinstance(initialized["response"], dict)

    model = await peer.control("c2", {"subtype": "set_model", "model": "claude-haiku-4-5"})
    assert model["subtype"] == "success"
    assert model["response"] == {"model": "claude-haiku-4-5"}
    mode = await peer.control("c3", {"subtype": "set_permission_mode", "mode": "acceptEdits"})
    assert (mode["subtype"], mode["response"]) == ("success", {"mode": "acceptEdits"})
    bad_mode = await peer.control("c4", {"subtype": "set_permission_mode", "mode": "nonsense"})
    assert bad_mode["subtype"] == "error"
    unknown = await peer.control("c5", {"subtype": "no_such_thing"})
    assert unknown["subtype"] == "error"
    assert unknown["error"] == "Unsupported control request subtype: no_such_thing"
    idle = await peer.control("c6", {"subtype": "interrupt"})
    assert (idle["subtype"], idle["response"]) == ("success", {"still_queued": []})
    assert not any(is_init(line) for line in peer.lines)

    sent = await peer.user("hello")
    init = await peer.expect(is_init)
    # The settings made before the first turn show in its init line.
    assert (init["model"], init["permissionMode"]) == ("claude-haiku-4-5", "acceptEdits")
    echo = await peer.expect(echo_of(sent))
    assert echo["isReplay"] is True
    result = await peer.expect(is_result)
    assert (result["subtype"], result["terminal_reason"]) == ("success", "completed")
    assert await peer.close() == 0
    if claude.server is not None:
        assert claude.server.agent_requests[0].body["model"] == "claude-haiku-4-5"


async def test_message_echoed_then_second_message_gets_its_own_result(start: Start) -> None:
    setup = Setup(
        script=[Turn(text="one"), Turn(text="two")], fake={"FAKE_CLAUDE_ECHO": "1"}, ask=False
    )
    setup.fake["FAKE_CLAUDE_NO_TOOL"] = "1"
    peer = (await start(setup)).peer
    first = await peer.user("one")
    await peer.expect(is_result)
    assert peer.index(is_init) < peer.index(echo_of(first)) < peer.index(is_result)
    echo = peer.lines[peer.index(echo_of(first))]
    assert echo["isReplay"] is True
    assert echo["message"]["content"] == "one"

    second = await peer.user("two")
    await peer.expect(echo_of(second))
    await peer.expect(is_result)
    assert await peer.close() == 0
    assert [r["result"] for r in peer.results] == ["one", "two"]
    assert [r["terminal_reason"] for r in peer.results] == ["completed", "completed"]
    # Each turn starts with its own init line.
    assert sum(is_init(line) for line in peer.lines) == 2


async def test_allowed_tool_runs_with_the_updated_input(start: Start) -> None:
    claude = await start(gated("asked.txt"))
    peer = claude.peer
    await peer.user("do it")
    asked = await peer.expect(is_asking)
    request = asked["request"]
    (tool_use,) = [
        block
        for line in peer.lines
        if line.get("type") == "assistant"
        for block in line["message"]["content"]
        if block.get("type") == "tool_use"
    ]
    assert asked["request_id"]
    assert request["tool_name"] == request["display_name"] == "Bash"
    assert request["input"] == {"command": "touch asked.txt; echo ran-42"}
    assert request["tool_use_id"] == tool_use["id"]
    assert isinstance(request["description"], str)
    assert isinstance(request["permission_suggestions"], list)

    changed = {"command": "touch changed.txt; echo ran-42"}
    await peer.answer(asked, {"behavior": "allow", "updatedInput": changed})
    await claude.tool_ran("changed.txt")
    await peer.expect(is_result)
    assert await peer.close() == 0
    (tool_result,) = tool_results(peer)
    assert tool_result["is_error"] is False
    assert "ran-42" in str(tool_result["content"])
    (result,) = peer.results
    assert (result["subtype"], result["terminal_reason"]) == ("success", "completed")
    if claude.kind == "real":
        assert not (claude.work / "asked.txt").exists()
    else:
        assert "asked.txt" not in claude.tool_log.read_text()


async def test_denied_tool_tells_the_model_and_the_turn_goes_on(start: Start) -> None:
    claude = await start(gated("denied.txt"))
    peer = claude.peer
    await peer.user("do it")
    asked = await peer.expect(is_asking)
    await peer.answer(asked, {"behavior": "deny", "message": "not now, thanks"})
    result = await peer.expect(is_result)
    assert await peer.close() == 0
    (tool_result,) = tool_results(peer)
    assert tool_result["tool_use_id"] == asked["request"]["tool_use_id"]
    assert (tool_result["content"], tool_result["is_error"]) == ("not now, thanks", True)
    assert (result["subtype"], result["is_error"]) == ("success", False)
    assert result["terminal_reason"] == "completed"
    assert [d["tool_use_id"] for d in result["permission_denials"]] == [
        asked["request"]["tool_use_id"]
    ]
    assert len(peer.results) == 1
    if claude.server is not None:
        assert "not now, thanks" in claude.server.agent_requests[-1].texts()
    else:
        assert not claude.tool_log.exists()


async def test_message_during_a_tool_joins_the_turn(start: Start) -> None:
    claude = await start(gated("steered.txt", gate=True))
    peer = claude.peer
    await peer.user("do it")
    asked = await peer.expect(is_asking)
    await peer.answer(asked, {"behavior": "allow", "updatedInput": asked["request"]["input"]})
    await claude.tool_ran("steered.txt")
    steer = await peer.user("and also this")
    # Both say when they read a message; only then may the tool end.
    await peer.expect(
        lambda o: (
            o.get("type") == "command_lifecycle"
            and o.get("command_uuid") == steer
            and o.get("state") == "queued"
        )
    )
    await claude.open_gate()
    await peer.expect(is_result)
    assert await peer.close() == 0
    assert len(peer.results) == 1
    tool_result_at = peer.index(
        lambda o: (
            o.get("type") == "user"
            and isinstance(o["message"].get("content"), list)
            and o["message"]["content"][0].get("type") == "tool_result"
        )
    )
    # Taken at the turn's next step: after the tool's result, before the result.
    assert tool_result_at < peer.index(echo_of(steer)) < peer.index(is_result)
    assert peer.results[0]["terminal_reason"] == "completed"
    if claude.server is not None:
        # The CLI wraps the message in a note of its own: look inside.
        assert any("and also this" in t for t in claude.server.agent_requests[-1].texts())


async def test_interrupt_during_a_tool_then_a_message_completes(start: Start) -> None:
    setup = gated("interrupted.txt", gate=True)
    setup.script = [*setup.script[:1], Turn(text="after the interrupt")]
    setup.fake["FAKE_CLAUDE_RESULT"] = "after the interrupt"
    setup.fake["FAKE_CLAUDE_TOOL_TURNS"] = "1"  # the next turn answers in text, as scripted
    claude = await start(setup)
    peer = claude.peer
    await peer.user("do it")
    asked = await peer.expect(is_asking)
    await peer.answer(asked, {"behavior": "allow", "updatedInput": asked["request"]["input"]})
    await claude.tool_ran("interrupted.txt")
    answer = await peer.control("i1", {"subtype": "interrupt"})
    assert (answer["subtype"], answer["response"]) == ("success", {"still_queued": []})
    aborted = await peer.expect(is_result)
    assert (aborted["subtype"], aborted["is_error"]) == ("error_during_execution", True)
    assert aborted["terminal_reason"] == "aborted_tools"
    (abandoned,) = tool_results(peer)
    assert abandoned["is_error"] is True

    again = await peer.user("go on")
    await peer.expect(echo_of(again))
    result = await peer.expect(is_result)
    assert (result["subtype"], result["terminal_reason"]) == ("success", "completed")
    assert result["result"] == "after the interrupt"
    assert await peer.close() == 0


async def test_interrupt_while_asking_withdraws_the_question(start: Start) -> None:
    peer = (await start(gated("never.txt"))).peer
    await peer.user("do it")
    asked = await peer.expect(is_asking)
    await peer.send(
        {"type": "control_request", "request_id": "i1", "request": {"subtype": "interrupt"}}
    )
    aborted = await peer.expect(is_result)
    assert aborted["terminal_reason"] == "aborted_tools"
    cancel = peer.lines[peer.index(lambda o: o.get("type") == "control_cancel_request")]
    assert cancel["request_id"] == asked["request_id"]
    # The exit code at EOF follows the last result: this one is an error.
    assert await peer.close() == 1
    assert len(peer.results) == 1


async def test_eof_while_asking_refuses_the_tool_and_ends(start: Start) -> None:
    claude = await start(gated("closed.txt"))
    peer = claude.peer
    await peer.user("do it")
    await peer.expect(is_asking)
    assert await peer.close() == 0
    (tool_result,) = tool_results(peer)
    assert tool_result["is_error"] is True
    assert "stream closed" in str(tool_result["content"])
    (result,) = peer.results
    assert result["terminal_reason"] == "completed"


async def test_send_file_through_our_mcp_server(start: Start, tmp_path: Path) -> None:
    inputs = [{"path": "report.txt", "comment": "here"}, {"path": "../secret.txt"}]
    setup = Setup(
        script=[Turn(tools=tuple(ToolCall(QUALIFIED_TOOL, i) for i in inputs)), Turn(text="sent")],
        fake={"FAKE_CLAUDE_NO_TOOL": "1", "FAKE_CLAUDE_SEND_FILE": json.dumps(inputs)},
        ask=False,
        send_file_limit=100,
    )
    claude = await start(setup)
    (claude.work / "report.txt").write_text("numbers")
    (tmp_path / "secret.txt").write_text("secret")
    peer = claude.peer
    await peer.user("send the report")
    init = await peer.expect(is_init)
    await peer.expect(is_result)
    assert await peer.close() == 0
    assert QUALIFIED_TOOL in init["tools"]
    assert {"name": "chatbridge", "status": "connected"}.items() <= next(
        s for s in init["mcp_servers"] if s["name"] == "chatbridge"
    ).items()
    uses = [
        block
        for line in peer.lines
        if line.get("type") == "assistant"
        for block in line["message"]["content"]
        if block.get("type") == "tool_use"
    ]
    assert [(u["name"], u["input"]) for u in uses] == [(QUALIFIED_TOOL, i) for i in inputs]
    good, bad = tool_results(peer)
    assert good["tool_use_id"] == uses[0]["id"]
    # A success: the server's content blocks as they came, and no is_error at all.
    assert good["content"] == [{"type": "text", "text": "queued report.txt"}]
    assert "is_error" not in good
    # A failure: the text joined into one string, is_error true.
    assert bad["tool_use_id"] == uses[1]["id"]
    assert bad["is_error"] is True
    assert isinstance(bad["content"], str)
    assert bad["content"].startswith("not sent: ../secret.txt: outside the working directory")


async def test_send_file_not_allowed_is_asked_for_like_any_tool(start: Start) -> None:
    inputs = {"path": "report.txt"}
    setup = Setup(
        script=[Turn(tools=(ToolCall(QUALIFIED_TOOL, inputs),)), Turn(text="sent")],
        fake={"FAKE_CLAUDE_NO_TOOL": "1", "FAKE_CLAUDE_SEND_FILE": json.dumps(inputs)},
        send_file_limit=100,
        send_file_allowed=False,
    )
    claude = await start(setup)
    (claude.work / "report.txt").write_text("numbers")
    peer = claude.peer
    await peer.user("send the report")
    asking = await peer.expect(is_asking)
    asked = asking["request"]
    assert asked["tool_name"] == QUALIFIED_TOOL
    assert asked["input"] == inputs
    assert asked["mcp_server"]["name"] == "chatbridge"
    assert asked["permission_suggestions"][0]["rules"] == [{"toolName": QUALIFIED_TOOL}]
    await peer.answer(asking, {"behavior": "allow", "updatedInput": inputs})
    await peer.expect(is_result)
    assert await peer.close() == 0
    [result] = tool_results(peer)
    assert result["content"] == [{"type": "text", "text": "queued report.txt"}]

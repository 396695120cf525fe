"""The ``chatbridge`` MCP server as claude reaches it: ``mcp_message`` control requests
that the run's supervisor answers (its own function for them, :func:`mcp_reply`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.model import RunId
from runner.command import build_argv
from runner.mcp_server import NotSendable, Server, check_sendable
from runner.request import RunRequest
from runner.supervisor import mcp_reply

LIMIT = 100


class Client:
    """Asks as claude does, the server declared as ``--mcp-config`` tells claude."""

    def __init__(self, cwd: Path, limit: int = LIMIT) -> None:
        request = RunRequest(
            run_id=RunId("r"),
            claude_bin="claude",
            cwd=cwd,
            prompt="",
            session_id=None,
            send_file_max_bytes=limit,
        )
        argv = build_argv(request)
        config = json.loads(argv[argv.index("--mcp-config") + 1])
        assert config == {"mcpServers": {"chatbridge": {"type": "sdk", "name": "chatbridge"}}}
        self.server: Server | None = Server(str(cwd), limit)
        self._next = 0

    def control(self, message: object, server_name: str = "chatbridge") -> dict[str, Any]:
        """The ``response`` of the supervisor's ``control_response`` line."""
        request = {"subtype": "mcp_message", "server_name": server_name, "message": message}
        line = mcp_reply("req-7", request, self.server)
        assert line.endswith(b"\n")
        assert b"\n" not in line[:-1]  # one line
        answer = json.loads(line)
        assert answer["type"] == "control_response"
        assert answer["response"]["request_id"] == "req-7"
        response: dict[str, Any] = answer["response"]
        return response

    def ask(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next += 1
        message = {"jsonrpc": "2.0", "id": self._next, "method": method, "params": params or {}}
        response = self.control(message)
        assert response["subtype"] == "success"
        answer: dict[str, Any] = response["response"]["mcp_response"]
        assert answer["id"] == self._next
        return answer

    def notify(self, method: str) -> dict[str, Any]:
        response = self.control({"jsonrpc": "2.0", "method": method})
        assert response["subtype"] == "success"
        answer: dict[str, Any] = response["response"]["mcp_response"]
        return answer

    def send(self, path: str) -> tuple[bool, str]:
        result = self.ask(
            "tools/call", {"name": "send_file", "arguments": {"path": path, "comment": "c"}}
        )["result"]
        return result["isError"], result["content"][0]["text"]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "ok.txt").write_text("fine")
    (work / "sub").mkdir()
    (work / "sub" / "deep.txt").write_text("deep")
    (work / "big.bin").write_bytes(b"x" * (LIMIT + 1))
    (tmp_path / "secret.txt").write_text("secret")
    (work / "link_out").symlink_to(tmp_path / "secret.txt")
    (work / "link_in").symlink_to(work / "ok.txt")
    os.mkfifo(work / "fifo")
    return work


@pytest.fixture
def client(work: Path) -> Client:
    return Client(work)


def test_handshake_and_tool_list(client: Client) -> None:
    init = client.ask("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
    assert init["result"]["protocolVersion"] == "2025-06-18"
    assert init["result"]["serverInfo"]["name"] == "chatbridge"
    assert "tools" in init["result"]["capabilities"]
    # A notification gets no JSON-RPC answer, but its control request an empty one.
    assert client.notify("notifications/initialized") == {"jsonrpc": "2.0", "result": {}}
    tools = client.ask("tools/list")["result"]["tools"]
    assert [t["name"] for t in tools] == ["send_file"]
    assert tools[0]["inputSchema"]["required"] == ["path"]
    assert client.ask("nope")["error"]["code"] == -32601


def test_an_unknown_protocol_version_gets_ours(client: Client) -> None:
    init = client.ask("initialize", {"protocolVersion": "1999-01-01"})
    assert init["result"]["protocolVersion"] == "2025-06-18"


@pytest.mark.parametrize(
    ("path", "answer"),
    [
        ("ok.txt", "queued ok.txt"),
        ("sub/deep.txt", "queued deep.txt"),
        ("sub/../ok.txt", "queued ok.txt"),
        ("link_in", "queued ok.txt"),
    ],
)
def test_files_inside_are_queued(client: Client, work: Path, path: str, answer: str) -> None:
    assert client.send(path) == (False, answer)
    assert client.send(str(work / path)) == (False, answer)  # absolute, inside


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../secret.txt", "outside the working directory"),
        ("sub/../../secret.txt", "outside the working directory"),
        ("/etc/hostname", "outside the working directory"),
        ("link_out", "outside the working directory"),
        ("big.bin", "over the limit"),
        ("sub", "not a regular file"),
        ("fifo", "not a regular file"),
        ("missing.txt", "no such file"),
        ("../missing-outside.txt", "outside the working directory"),
        ("", "no path given"),
    ],
)
def test_refused_paths(client: Client, path: str, why: str) -> None:
    error, text = client.send(path)
    assert error
    assert why in text


def test_bad_calls_are_tool_errors(client: Client) -> None:
    result = client.ask("tools/call", {"name": "send_file", "arguments": {"path": 3}})["result"]
    assert result["isError"]
    result = client.ask("tools/call", {"name": "other", "arguments": {}})["result"]
    assert result["isError"]


def test_another_server_or_none_is_an_error(client: Client) -> None:
    """claude is never left waiting: a server that is not ours (or ours, in a run
    without ``send_file``) is a control error."""
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    other = client.control(ping, server_name="theirs")
    assert other["subtype"] == "error"
    assert "theirs" in other["error"]
    client.server = None
    assert client.control(ping)["subtype"] == "error"


def test_a_message_that_is_no_object_gets_an_empty_answer(client: Client) -> None:
    response = client.control(["not", "an", "object"])
    assert response["response"]["mcp_response"] == {"jsonrpc": "2.0", "result": {}}
    assert client.send("ok.txt") == (False, "queued ok.txt")


def test_no_mcp_server_without_a_limit(tmp_path: Path) -> None:
    request = RunRequest(
        run_id=RunId("r"), claude_bin="claude", cwd=tmp_path, prompt="", session_id=None
    )
    assert "--mcp-config" not in build_argv(request)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["..", ".", "sub", "ok.txt", "link_out", "link_in", "/", "x"]),
        min_size=1,
        max_size=6,
    )
)
def test_nothing_outside_ever_passes(
    tmp_path_factory: pytest.TempPathFactory, parts: list[str]
) -> None:
    root = tmp_path_factory.getbasetemp() / "prop"
    work = root / "work"
    if not work.exists():
        (work / "sub").mkdir(parents=True)
        (work / "ok.txt").write_text("fine")
        (root / "outside.txt").write_text("secret")
        (work / "link_out").symlink_to(root / "outside.txt")
        (work / "link_in").symlink_to(work / "ok.txt")
        (work / "sub" / "link_out").symlink_to(root)
    try:
        found = check_sendable(work, "/".join(parts), LIMIT)
    except NotSendable:
        return
    assert found.path.is_relative_to(work.resolve())
    assert found.path.is_file()

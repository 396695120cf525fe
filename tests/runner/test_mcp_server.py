"""The ``chatbridge`` MCP server as claude starts it: a real subprocess speaking JSON-RPC."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.model import RunId
from runner.command import build_argv
from runner.mcp_server import NotSendable, check_sendable
from runner.request import RunRequest

LIMIT = 100


class Client:
    """Talks to the server started exactly as ``--mcp-config`` tells claude to."""

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
        server = config["mcpServers"]["chatbridge"]
        self.process = subprocess.Popen(
            [server["command"], *server["args"]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )
        self._next = 0

    def ask(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self._next += 1
        message = {"jsonrpc": "2.0", "id": self._next, "method": method, "params": params or {}}
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        assert answer["id"] == self._next
        return answer

    def notify(self, method: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}) + "\n")
        self.process.stdin.flush()

    def send(self, path: str) -> tuple[bool, str]:
        result = self.ask(
            "tools/call", {"name": "send_file", "arguments": {"path": path, "comment": "c"}}
        )["result"]
        return result["isError"], result["content"][0]["text"]

    def close(self) -> int:
        """Close stdin as claude does; the server ends on its own."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        code = self.process.wait(timeout=10)
        self.process.stdout.close()
        return code


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
def client(work: Path) -> Iterator[Client]:
    client = Client(work)
    yield client
    if not client.process.stdout or not client.process.stdout.closed:
        assert client.close() == 0


def test_handshake_and_tool_list(client: Client) -> None:
    init = client.ask("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
    assert init["result"]["protocolVersion"] == "2025-06-18"
    assert init["result"]["serverInfo"]["name"] == "chatbridge"
    assert "tools" in init["result"]["capabilities"]
    client.notify("notifications/initialized")  # no answer to a notification
    tools = client.ask("tools/list")["result"]["tools"]
    assert [t["name"] for t in tools] == ["send_file"]
    assert tools[0]["inputSchema"]["required"] == ["path"]
    assert client.ask("nope")["error"]["code"] == -32601
    assert client.close() == 0


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


def test_bad_json_is_a_parse_error(client: Client) -> None:
    assert client.process.stdin is not None
    assert client.process.stdout is not None
    client.process.stdin.write("{nope\n")
    client.process.stdin.flush()
    assert json.loads(client.process.stdout.readline())["error"]["code"] == -32700
    assert client.send("ok.txt") == (False, "queued ok.txt")


def test_no_mcp_server_without_a_limit(tmp_path: Path) -> None:
    request = RunRequest(
        run_id=RunId("r"), claude_bin="claude", cwd=tmp_path, prompt="", session_id=None
    )
    assert "--mcp-config" not in build_argv(request)


def test_bad_arguments_exit_2() -> None:
    server = Path(sys.modules["runner.mcp_server"].__file__ or "")
    done = subprocess.run([sys.executable, str(server)], capture_output=True, check=False)
    assert done.returncode == 2


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

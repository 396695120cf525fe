"""Detached runs driven over the supervisor's socket: requests, journals, records."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.core.model import LiveRun, RunId
from runner import RunRequest, Spawned, ToolResult, run_claude
from tests.runner.conftest import Recorder
from tests.runner.fake_runs import fake_env, make_request


def records(data: bytes) -> Iterator[tuple[dict[str, Any], bytes, int]]:
    """Parse journal bytes: (header, payload, offset just past the record)."""
    pos = 0
    while pos < len(data):
        nl = data.index(b"\n", pos)
        head = json.loads(data[pos:nl])
        n = head.get("n", 0)
        yield head, data[nl + 1 : nl + 1 + n], nl + 1 + n
        pos = nl + 1 + n


def journal(live: LiveRun) -> bytes:
    return (Path(live.run_dir) / "journal").read_bytes()


def waiting_request(run_id: RunId, tmp_path: Path, **overrides: Any) -> RunRequest:
    """A run that holds after its tool events until ``tmp_path/go`` exists."""
    switches = overrides.pop("switches", {})
    env = fake_env(
        tmp_path, wait_for=str(tmp_path / "go"), times=str(tmp_path / "times"), **switches
    )
    fields: dict[str, Any] = {"env": env, "state_dir": tmp_path / "state"}
    fields.update(overrides)
    return make_request(run_id, tmp_path, **fields)


async def detached(request: RunRequest, recorder: Recorder) -> LiveRun:
    """Start ``request``, and once its tool ran, cancel the bridge's side with ``detach``."""
    task = asyncio.create_task(run_claude(request, recorder, detach=lambda: True))
    await recorder.wait_for(ToolResult)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (spawned,) = recorder.of(Spawned)
    assert spawned.live is not None
    return spawned.live


EOF = b'{"t":"eof"}\n'


def connect(live: LiveRun, offset: int = 0, versions: tuple[int, ...] = (1,)) -> socket.socket:
    """A raw bridge connection (through the run directory's fd: paths may be long)."""
    dirfd = os.open(live.run_dir, os.O_PATH | os.O_DIRECTORY)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(f"/proc/self/fd/{dirfd}/sock")
    finally:
        os.close(dirfd)
    sock.sendall(
        json.dumps({"t": "attach", "v": list(versions), "offset": offset}).encode() + b"\n"
    )
    return sock


async def read_line(sock: socket.socket) -> dict[str, Any]:
    line = b""
    while not line.endswith(b"\n"):
        chunk = await asyncio.to_thread(sock.recv, 1)
        if not chunk:
            raise EOFError(line)
        line += chunk
    data: dict[str, Any] = json.loads(line)
    return data


async def read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := await asyncio.to_thread(sock.recv, 65536):
        data += chunk
    return data


def release(tmp_path: Path) -> None:
    (tmp_path / "go").touch()

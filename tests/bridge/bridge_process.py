"""The real ``chatbridge`` process for the lifecycle tests; checks that no run's process is left."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runner.process import find_marked, kill_marked
from tests.bridge.harness import rows


class Bridge:
    """``chatbridge run`` as a child process with its console on pipes."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.out = ""
        self._changed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBRIDGE_")}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bridge", "run", "--config", str(self.config),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.out += line.decode()
            self._changed.set()
        self._changed.set()

    def send(self, line: str) -> None:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())

    async def wait_for(self, text: str) -> None:
        while text not in self.out:
            assert self._reader is not None
            if self._reader.done():
                raise AssertionError(
                    f"exited before printing {text!r}:\n{self.out}\n{await self.stderr()}"
                )
            self._changed.clear()
            await self._changed.wait()

    async def stderr(self) -> str:
        assert self.proc is not None
        assert self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode()

    async def end_input(self) -> int:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return await self.exit_code()

    async def exit_code(self) -> int:
        assert self.proc is not None
        assert self._reader is not None
        code = await self.proc.wait()
        await self._reader
        return code

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)


def rows_or_none(tmp_path: Path, sql: str) -> list[tuple[object, ...]] | None:
    try:
        return rows(tmp_path, sql)
    except sqlite3.OperationalError:  # not created or not migrated yet
        return None


async def wait_rows(tmp_path: Path, sql: str, expected: list[tuple[object, ...]]) -> None:
    # Another process writes the database: there is no event to wait on, only its state.
    async with asyncio.timeout(30):
        while rows_or_none(tmp_path, sql) != expected:
            await asyncio.sleep(0.05)


@pytest.fixture
async def no_leftovers(tmp_path: Path) -> AsyncIterator[None]:
    yield
    if (tmp_path / "bridge.db").exists():
        leftovers = {
            str(r[0]): find_marked(str(r[0])) for r in rows(tmp_path, "select id from runs")
        }
        for run_id, pids in leftovers.items():
            if pids:
                await kill_marked(run_id, 1.0)
        assert not any(leftovers.values()), f"processes survived: {leftovers}"


def escaping_tree(tmp_path: Path) -> dict[str, str]:
    """A slow run whose tools escape the environment marker (pids in tmp_path/escape)."""
    (tmp_path / "escape").mkdir(exist_ok=True)
    return {
        "FAKE_CLAUDE_SLEEP": "60",
        "FAKE_CLAUDE_ESCAPE": str(tmp_path / "escape"),
        "FAKE_CLAUDE_RECORD": str(tmp_path / "record.json"),
    }


def run_pids(tmp_path: Path) -> list[int]:
    """claude's pid and those of its escaping tools, from the fake's record."""
    record = json.loads((tmp_path / "record.json").read_text())
    return [record["pid"], *record["escaped"]]

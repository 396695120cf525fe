"""The headline: a message to its answer with the REAL claude CLI, through chatbridge and not.

claude (``.venv``'s, from claude-agent-sdk) answers from the scripted model
server (tests/fakes/model_server.py, answering at once, in a process of its
own). Measured in one run, load noted beside each figure:

- ``claude -p`` run directly: spawn to exit;
- claude's turn: a started, initialized claude (stream-json both ways, as a
  prestart leaves it) from its prompt to its result line;
- the console through ``chatbridge run`` (a subprocess, the line written to
  its stdin to the answer line on its stdout), with ``coalesce_ms`` 300 and
  1500 (the default), prestart on (the default) and off; the sign of life
  (``· received``) is timed too;
- Matrix against a bare echo bot on one Synapse (``--matrix``): the user's
  message to the answer in their own ``/sync``, with the default window
  (follows typing: ``idle_ms`` 300; the user sends no typing notices) and
  plain windows of 300 and 1500 ms; and the first sign of life (the bot's
  typing, as the user's ``/sync`` delivers it);
- memory: RSS of the bridge, of each supervisor and of each idle prestarted
  claude, during an open 1.5 s window (``ps`` of the console service's tree).

Goals printed beside the figures: with prestart, at most window + claude's
turn + 25 ms; following typing with a single message, at most ``idle_ms`` +
claude's turn + 25 ms; the sign of life at most 100 ms at p99.

    python bench/bench_headline.py [--runs 12] [--matrix] [--no-console]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).parents[1]))

from tests.config_files import toml_text
from tests.fakes.model_server import ModelServer, claude_bin, claude_env

CHATBRIDGE = Path(sys.executable).parent / "chatbridge"
ANSWER = "Nothing more to do."
"""The model server's answer to every prompt."""
SLACK_MS = 25.0
SIGN_OF_LIFE_GOAL_MS = 100.0
RUN_END_PAUSE_S = 1.0
"""After each answer: the run ends (claude exits) before the next message."""


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def pct(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) < 2:
        return samples[0], samples[0], samples[0]
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[89], cuts[98]


def row(name: str, samples: list[float]) -> float:
    p50, p90, p99 = pct(samples)
    print(f"  {name:44} p50 {p50:7.1f}  p90 {p90:7.1f}  p99 {p99:7.1f} ms  ({load()})")
    return p50


def goal(what: str, value: float, limit: float) -> None:
    verdict = "met" if value <= limit else "NOT met"
    print(f"  goal: {what}: {value:.1f} <= {limit:.1f} ms: {verdict}")


# -- the model server, in a process of its own ------------------------------------------


async def serve_model() -> None:
    async with ModelServer([], default=_turn()) as server:
        print(server.url, flush=True)
        await asyncio.Event().wait()


def _turn() -> Any:
    from tests.fakes.model_server import Turn

    return Turn(text=ANSWER)


@asynccontextmanager
async def model_server() -> AsyncIterator[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve-model", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        url = (await process.stdout.readline()).decode().strip()
        yield url
    finally:
        process.terminate()
        await process.wait()


# -- claude alone ---------------------------------------------------------------------------


async def direct(env: dict[str, str], work: Path, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            str(claude_bin()), "-p", "hello", "--output-format", "json",
            "--permission-mode", "bypassPermissions",
            env=env, cwd=work, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        out, _ = await process.communicate()
        times.append((time.monotonic() - start) * 1000)
        assert ANSWER in out.decode(), out[-300:]
    return times


async def turn(env: dict[str, str], work: Path, runs: int) -> list[float]:
    """A ready claude (initialized, as a prestart leaves it): prompt to result line."""
    times = []
    for n in range(runs):
        process = await asyncio.create_subprocess_exec(
            str(claude_bin()), "-p", "--input-format", "stream-json",
            "--output-format", "stream-json", "--verbose",
            "--permission-mode", "bypassPermissions",
            env=env, cwd=work, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        assert process.stdin is not None
        assert process.stdout is not None
        init = {"type": "control_request", "request_id": f"init-{n}"}
        init["request"] = {"subtype": "initialize"}  # type: ignore[assignment]
        process.stdin.write((json.dumps(init) + "\n").encode())
        await _line_of(process.stdout, "control_response")
        await asyncio.sleep(0.5)  # idle, as during a window
        prompt = {"type": "user", "message": {"role": "user", "content": "hello"}}
        start = time.monotonic()
        process.stdin.write((json.dumps(prompt) + "\n").encode())
        await _line_of(process.stdout, "result")
        times.append((time.monotonic() - start) * 1000)
        process.stdin.close()
        await process.wait()
    return times


async def _line_of(stream: asyncio.StreamReader, kind: str) -> dict[str, Any]:
    while line := await stream.readline():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("type") == kind:
            return data
    raise RuntimeError(f"claude ended before a {kind} line")


# -- the console through chatbridge --------------------------------------------------------


def console_config(tmp: Path, env: dict[str, str], coalesce_ms: int, prestart: bool) -> Path:
    config = {
        "runner": {
            "claude_bin": str(claude_bin()),
            "state_dir": tmp / "state",
            "on_shutdown": "stop",
            "prestart": prestart,
        },
        "dispatcher": {"coalesce_ms": coalesce_ms},
        "database": {"url": f"sqlite+aiosqlite:///{tmp / 'chatbridge.db'}"},
        "http": {"listen": ""},
        "defaults": {"cwd": tmp, "env": env, "permission_mode": "bypassPermissions"},
    }
    path = tmp / "chatbridge.toml"
    path.write_text(toml_text(config))
    return path


@asynccontextmanager
async def console_service(config: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await asyncio.create_subprocess_exec(
        str(CHATBRIDGE), "run", "--config", str(config), cwd=config.parent,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    drain: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(60):
            while b"chatbridge ready" not in await process.stderr.readline():
                pass
        drain = asyncio.create_task(_drain(process.stderr))
        yield process
    finally:
        if process.returncode is None:
            assert process.stdin is not None
            process.stdin.close()
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        if drain is not None:
            await drain  # to the end of its log: the prestarts given up at shutdown too


PRESTARTS: Counter[str] = Counter()
"""Prestart outcomes the console services logged: how often one is started for nothing."""


async def _drain(stream: asyncio.StreamReader) -> None:
    while line := (await stream.readline()).decode(errors="replace"):
        if " prestart " in line and " used" in line:
            PRESTARTS["used"] += 1
        elif " prestart " in line and "given up: " in line:
            PRESTARTS["wasted: " + line.rsplit("given up: ", 1)[1].strip()] += 1


async def console(
    tmp: Path, env: dict[str, str], coalesce_ms: int, prestart: bool, runs: int
) -> tuple[list[float], list[float], dict[str, list[int]]]:
    """(message → answer, message → sign of life, RSS by process kind during a window)."""
    await asyncio.to_thread(tmp.mkdir)
    answers, signs = [], []
    memory: dict[str, list[int]] = {}
    async with console_service(console_config(tmp, env, coalesce_ms, prestart)) as process:
        assert process.stdin is not None
        assert process.stdout is not None
        for n in range(runs + 1):  # the first run warms up
            start = time.monotonic()
            process.stdin.write(f"ping {n}\n".encode())
            await process.stdin.drain()
            sign = None
            while (line := (await process.stdout.readline()).decode().rstrip()) != ANSWER:
                if line == "· received" and sign is None:
                    sign = time.monotonic()
                    if n == 1 and prestart:
                        # The prestarted claude is up and idle well before a 1.5 s window ends.
                        await asyncio.sleep(min(1.0, coalesce_ms / 1000 * 0.8))
                        memory = rss_by_kind(process.pid)
            if n:
                answers.append((time.monotonic() - start) * 1000)
                if sign is not None:
                    signs.append((sign - start) * 1000)
            await asyncio.sleep(RUN_END_PAUSE_S)
    return answers, signs, memory


def rss_by_kind(pid: int) -> dict[str, list[int]]:
    """RSS (bytes) of the bridge and of its descendants, by kind."""
    kinds: dict[str, list[int]] = {"bridge": [psutil.Process(pid).memory_info().rss]}
    for child in psutil.Process(pid).children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            rss = child.memory_info().rss
        except psutil.Error:
            continue
        kind = "supervisor" if "supervisor" in cmd else "claude" if "claude" in cmd else "other"
        kinds.setdefault(kind, []).append(rss)
    # Supervisors run detached (their own session): find them by their run's claude's parent.
    for proc in psutil.process_iter(["cmdline", "memory_info", "ppid"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "runner.supervisor" in cmd and str(pid) not in cmd:
            kinds.setdefault("supervisor (all on host)", []).append(proc.info["memory_info"].rss)
    return kinds


# -- main --------------------------------------------------------------------------------------


async def main(runs: int, matrix: bool, console_too: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-headline-") as tmp_name:
        tmp = Path(tmp_name)
        async with model_server() as url:
            home = tmp / "home"
            home.mkdir()
            env = claude_env(url, home)
            work = tmp / "work"
            work.mkdir()
            print(f"claude alone, {runs} runs each")
            direct_p50 = row(
                "claude -p, spawn to exit", await direct({**os.environ, **env}, work, runs)
            )
            turn_p50 = row(
                "claude's turn (ready claude: prompt to result)",
                await turn({**os.environ, **env}, work, runs),
            )
            print(f"console through chatbridge, {runs} messages each (answer / sign of life)")
            for coalesce_ms in (300, 1500) if console_too else ():
                for prestart in (True, False):
                    name = f"coalesce {coalesce_ms}, prestart {'on' if prestart else 'off'}"
                    answers, signs, memory = await console(
                        tmp / f"console-{coalesce_ms}-{prestart}", env, coalesce_ms, prestart, runs
                    )
                    p50 = row(name + ": answer", answers)
                    if signs:
                        row(name + ": sign of life", signs)
                    if prestart:
                        goal("window + turn + 25", p50, coalesce_ms + turn_p50 + SLACK_MS)
                    print(f"    above claude -p: {p50 - direct_p50:+.1f} ms")
                    if memory:
                        mib = {k: [round(v / 2**20, 1) for v in vs] for k, vs in memory.items()}
                        print(f"    RSS MiB during an open window: {mib}")
            print(f"  prestarts of the console runs above: {dict(PRESTARTS)}")
            if matrix:
                from bench_headline_matrix import bench_matrix

                await bench_matrix(tmp, env, runs, turn_p50)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--matrix", action="store_true")
    parser.add_argument("--no-console", action="store_true", help="claude alone and Matrix only")
    parser.add_argument("--serve-model", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_model:
        asyncio.run(serve_model())
    else:
        asyncio.run(main(args.runs, args.matrix, not args.no_console))

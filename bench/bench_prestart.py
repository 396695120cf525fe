"""Prestart: from the batch's flush (the ``run_claude`` call) to claude's first model request.

The real claude (``.venv``'s, from claude-agent-sdk) against the scripted
model server (tests/fakes/model_server.py, which stamps each request with
``time.monotonic()``), cold and prestarted (``runner.prestart``: started, its
``initialize`` answered, then idle for ``--debounce-s`` as during a batch's
debounce), without and with an MCP server that takes 1 s to start
(bench/slow_mcp_server.py). Printed: p50/p90 in ms and the cold/prestarted
ratio of the p50s.

    python bench/bench_prestart.py [--runs 8] [--debounce-s 1.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

from bridge.core.model import RunId, RunStatus
from runner import RunEvent, RunRequest, run_claude
from runner.prestart import prestart
from tests.fakes.model_server import ModelServer, Turn, claude_bin, claude_env

SLOW_MCP = Path(__file__).with_name("slow_mcp_server.py")


async def ignore(event: RunEvent) -> None:
    pass


def request(home: Path, work: Path, url: str, mcp: bool) -> RunRequest:
    extra: tuple[str, ...] = ()
    if mcp:
        config = {"mcpServers": {"slow": {"command": sys.executable, "args": [str(SLOW_MCP), "1"]}}}
        extra = ("--mcp-config", json.dumps(config))
    return RunRequest(
        run_id=RunId(f"bench-{uuid.uuid4()}"),
        claude_bin=str(claude_bin()),
        cwd=work,
        prompt="hello",
        session_id=None,
        permission_mode="bypassPermissions",
        env=claude_env(url, home),
        extra_args=extra,
        stop_grace_s=2.0,
    )


async def one(server: ModelServer, base: RunRequest, warm: bool, debounce_s: float) -> float:
    """ms from the run_claude call to the run's first agent request."""
    req = replace(base, run_id=RunId(f"bench-{uuid.uuid4()}"))
    started = None
    if warm:
        started = await prestart(replace(req, prompt=""))
        if not await started.ready:
            raise RuntimeError("the prestart did not get ready")
        await asyncio.sleep(debounce_s)  # the batch's debounce, while claude idles
    seen = len(server.agent_requests)
    flushed = time.monotonic()
    report = await run_claude(req, ignore, prestarted=started)
    if report.status is not RunStatus.SUCCEEDED:
        raise RuntimeError(report.error)
    first = server.agent_requests[seen]
    return (first.at - flushed) * 1000


def quantiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=10, method="inclusive")
    return statistics.median(samples), cuts[8]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--debounce-s", type=float, default=1.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        work.mkdir()
        async with ModelServer([], default=Turn(text="ok")) as server:
            for mcp in (False, True):
                base = request(home, work, server.url, mcp)
                await one(server, base, False, 0)  # warm the CLI's caches and HOME
                p50s = {}
                for warm in (False, True):
                    samples = [
                        await one(server, base, warm, args.debounce_s) for _ in range(args.runs)
                    ]
                    p50, p90 = quantiles(samples)
                    p50s[warm] = p50
                    label = (
                        f"{'prestarted' if warm else 'cold':10} {'MCP 1 s' if mcp else 'no MCP'}"
                    )
                    figures = f"p50 {p50:5.0f} ms  p90 {p90:5.0f} ms"
                    print(f"{label:19} flush -> first model request: {figures}")
                print(f"{'':19} cold/prestarted (p50): {p50s[False] / p50s[True]:.1f}x")


if __name__ == "__main__":
    asyncio.run(main())

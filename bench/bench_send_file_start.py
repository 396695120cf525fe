"""What the ``send_file`` MCP server adds to a run's start, with the real claude.

The real claude against the scripted model server (tests/fakes/model_server.py
stamps each request with ``time.monotonic()``): from the ``run_claude`` call to
the run's first model request, without the ``chatbridge`` MCP server and with it
(``send_file_max_bytes`` set), taking turns. Printed: p50/p90 in ms of each and
the difference of the p50s (docs/performance.md).

    python bench/bench_send_file_start.py [--runs 6]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bridge.core.model import RunId
from runner import RunEvent, RunRequest, run_claude
from runner.mcp_server import QUALIFIED_TOOL
from tests.fakes.model_server import ModelServer, Turn, claude_bin, claude_env


async def ignore(event: RunEvent) -> None:
    pass


async def one(tmp: Path, send_file_max_bytes: int | None) -> float:
    """ms from the run_claude call to the run's first model request."""
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    async with ModelServer([Turn(text="hi")]) as server:
        req = RunRequest(
            run_id=RunId(f"bench-{uuid.uuid4()}"),
            claude_bin=str(claude_bin()),
            cwd=work,
            prompt="hello",
            session_id=None,
            allowed_tools=(QUALIFIED_TOOL,),
            env=claude_env(server.url, tmp / "home"),
            stop_grace_s=2.0,
            send_file_max_bytes=send_file_max_bytes,
        )
        started = time.monotonic()
        await run_claude(req, ignore)
        await server.wait_agent_requests(1)
        return (server.agent_requests[0].at - started) * 1000


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered):7.1f} ms  p90 {p90:7.1f} ms"


async def main(runs: int) -> None:
    without: list[float] = []
    with_server: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-send-file-") as tmp:
        for _ in range(runs):
            without.append(await one(Path(tmp), None))
            with_server.append(await one(Path(tmp), 1_000_000))
    print(f"without the MCP server: {summary(without)}")
    print(f"with send_file:         {summary(with_server)}")
    added = statistics.median(with_server) - statistics.median(without)
    print(f"added by send_file (p50): {added:+.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    asyncio.run(main(parser.parse_args().runs))

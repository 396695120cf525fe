"""From ``!approve`` to the tool running: the real claude asks, the room answers.

chatbridge in-process with its console room (tests/bridge/harness.py), the
real claude (``.venv``'s, from claude-agent-sdk) against the scripted model
server, ``approve_tools = true``: each run's model asks for one Bash command
that appends the wall-clock time to a file. The bench waits for the request
in the room, writes ``!approve`` and notes the time; the difference to the
command's timestamp is the time from the answer to the tool running (the
console's own latency is a pipe read: the transport's part is nil here).
Printed: p50/p90/max in ms.

    python bench/bench_approve.py [--runs 15]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from bridge.config import load_settings
from tests.bridge.harness import ConsoleSession, write_config
from tests.fakes.model_server import ModelServer, ToolCall, Turn, claude_bin, claude_env


async def bench(runs: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="bench-approve-") as name:
        tmp = Path(name)
        stamps = tmp / "stamps"
        # A write (the redirection) makes claude ask: read-only commands it runs unasked.
        tool = ToolCall("Bash", {"command": f"date +%s.%N >> {stamps}"})
        script = [Turn(tools=(tool,)), Turn(text="done")] * runs
        async with ModelServer(script) as server:
            env = claude_env(server.url, tmp / "home")
            config = {
                "runner": {"claude_bin": str(claude_bin()), "stop_grace_s": 2.0},
                "defaults": {"approve_tools": True, "permission_mode": "default"},
                "dispatcher": {"coalesce_ms": 20},
            }
            path = write_config(tmp, config, env=env)
            settings = load_settings(path)
            waits: list[float] = []
            async with ConsoleSession(settings) as bridge:
                for i in range(runs):
                    bridge.send(f"run {i}")
                    await bridge.wait_for("Claude asks to use", i + 1)
                    answered = time.time()
                    bridge.send("!approve")
                    await bridge.wait_for("done", i + 1)
                    ran = float(stamps.read_text().split()[i])
                    waits.append((ran - answered) * 1000)
            return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    waits = asyncio.run(bench(args.runs))
    cuts = statistics.quantiles(waits, n=10, method="inclusive")
    print(f"!approve → the tool runs, ms ({len(waits)} runs, real claude, console room)")
    print(f"  p50 {statistics.median(waits):7.1f}   p90 {cuts[-1]:7.1f}   max {max(waits):7.1f}")


if __name__ == "__main__":
    main()

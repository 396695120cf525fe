"""Stop latency of a run until its whole process tree is gone.

Runs the fake claude (tests/fakes/fake_claude.py) through ``run_claude`` and
cancels the run once its tools are running, as ``!stop`` does. Measures, per
scenario, the time from ``cancel()`` until the cancelled task finished (by
then the run's supervisor, and with it every process of the run, is gone;
the marker is checked too), and the time from calling ``run_claude`` to its
``Spawned`` event (claude running under its supervisor).

    .venv/bin/python bench/bench_stop.py [--stops N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge.core.model import RunId  # noqa: E402
from runner import RunEvent, RunRequest, Spawned, ToolResult, find_marked, run_claude  # noqa: E402
from tests.fakes.fake_claude import install  # noqa: E402

STOP_GRACE_S = 0.5
SCENARIOS = {
    "cooperative": {},
    "ignores SIGTERM": {"FAKE_CLAUDE_IGNORE_TERM": "1"},
    "setsid grandchild": {"FAKE_CLAUDE_GRANDCHILD": "1"},
}


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


async def one_stop(claude: Path, switches: dict[str, str], workdir: Path) -> tuple[float, float]:
    """Start a run, stop it once its tool ran; return (spawn latency, stop latency)."""
    run_id = RunId(f"bench-{uuid.uuid4()}")
    called = time.perf_counter()
    spawned_at = 0.0
    tool_done = asyncio.Event()

    async def on_event(event: RunEvent) -> None:
        nonlocal spawned_at
        if isinstance(event, Spawned):
            spawned_at = time.perf_counter()
        elif isinstance(event, ToolResult):
            tool_done.set()

    request = RunRequest(
        run_id=run_id,
        claude_bin=str(claude),
        cwd=workdir,
        prompt="bench",
        session_id=None,
        env={"FAKE_CLAUDE_SLEEP": "300", **switches},
        stop_grace_s=STOP_GRACE_S,
    )
    task = asyncio.create_task(run_claude(request, on_event))
    await tool_done.wait()
    stop_at = time.perf_counter()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    stopped = time.perf_counter()
    left = find_marked(run_id)
    if left:
        raise SystemExit(f"processes survived the stop: {left}")
    return spawned_at - called, stopped - stop_at


async def main(stops: int) -> None:
    print(f"fake claude via {sys.executable}; stop_grace_s = {STOP_GRACE_S}; {stops} stops each\n")
    header = f"{'scenario':<20} {'stop p50':>10} {'stop p99':>10} {'stop max':>10}"
    header += f" {'spawn p50':>10} {'spawn p99':>10}"
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="bench-stop-") as tmp:
        claude = install(Path(tmp))
        for name, switches in SCENARIOS.items():
            spawns: list[float] = []
            latencies: list[float] = []
            for _ in range(stops):
                spawn, stop = await one_stop(claude, switches, Path(tmp))
                spawns.append(spawn)
                latencies.append(stop)
            ms = [x * 1000 for x in latencies]
            sp = [x * 1000 for x in spawns]
            print(
                f"{name:<20} {percentile(ms, 50):>8.1f}ms {percentile(ms, 99):>8.1f}ms"
                f" {max(ms):>8.1f}ms {percentile(sp, 50):>8.1f}ms {percentile(sp, 99):>8.1f}ms"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, default=15)
    asyncio.run(main(parser.parse_args().stops))

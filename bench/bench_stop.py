"""Stop latency of a run until its whole process tree is gone, with few and many host processes.

Runs the fake claude (tests/fakes/fake_claude.py) through ``run_claude`` and
cancels the run once its tools are running, as ``!stop`` does. Measures, per
scenario, the time from ``cancel()`` until the cancelled task finished (by
then the run's supervisor, and with it every process of the run, is gone;
the marker is checked too), and the time from calling ``run_claude`` to its
``Spawned`` event (claude running under its supervisor).

A stop that must find the run's processes by scanning /proc pays for every
process on the host, so each scenario runs twice: with the host as it is
(about 100 processes on a bare machine) and with about 1,100, the extra ones
idle ``sleep`` processes the bench starts (and ends). Each of those runs
once without a cgroup (the supervisor finds the tree through /proc) and,
where the host allows, with the run in a cgroup of its own (the group lists
the run's processes: no scan). One /proc scan of the bridge's fallback
sweep (``find_marked``, in a worker thread since it is not cheap) is timed
at both sizes too.

    .venv/bin/python bench/bench_stop.py [--stops N] [--crowd N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge.core.model import RunId  # noqa: E402
from runner import RunEvent, RunRequest, Spawned, ToolResult, find_marked, run_claude  # noqa: E402
from runner.cgroups import probe  # noqa: E402
from tests.fakes.fake_claude import install  # noqa: E402

STOP_GRACE_S = 0.5
SCENARIOS = {
    "cooperative": {},
    "ignores SIGTERM": {"FAKE_CLAUDE_IGNORE_TERM": "1"},
    "setsid grandchild": {"FAKE_CLAUDE_GRANDCHILD": "1"},
}
CROWD = 1_100
"""Processes on the host in the crowded runs (the bench tops it up with idle ones)."""
IDLE_S = 900
"""How long an idle process sleeps at most: a bench killed with SIGKILL leaves none for long."""
SCANS = 30


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def host_processes() -> int:
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


@contextlib.asynccontextmanager
async def crowd(total: int) -> AsyncIterator[int]:
    """Top the host up to about ``total`` processes with idle ones; yield how many there are.

    One shell in a session of its own starts them and waits on its stdin:
    its end (ours closing it, or the bench dying) makes the shell end its
    whole process group and reap it, so they are gone once the shell is.
    """
    extra = max(0, total - host_processes())
    script = (
        'i=0; while [ "$i" -lt "$1" ]; do sleep "$2" & i=$((i+1)); done; '
        "echo ready; read -r _; trap '' TERM; kill 0; wait"
    )
    shell = await asyncio.create_subprocess_exec(
        "sh", "-c", script, "crowd", str(extra), str(IDLE_S),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    if shell.stdin is None or shell.stdout is None:
        raise RuntimeError("no pipes to the crowd's shell")
    try:
        if await shell.stdout.readline() != b"ready\n":
            raise SystemExit("the idle processes did not start")
        yield host_processes()
    finally:
        shell.stdin.close()
        try:
            await asyncio.wait_for(shell.wait(), 30)
        except TimeoutError:
            os.killpg(shell.pid, signal.SIGKILL)
            await shell.wait()


async def one_stop(
    claude: Path, switches: dict[str, str], workdir: Path, cgroup_parent: str
) -> tuple[float, float]:
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
        cgroup_parent=cgroup_parent,
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


def scan_cost() -> str:
    """One marker scan of /proc, as the bridge's fallback sweep does it."""
    times = []
    for _ in range(SCANS):
        t0 = time.perf_counter()
        find_marked("bench-no-such-run")
        times.append((time.perf_counter() - t0) * 1000)
    return f"p50 {percentile(times, 50):.1f} ms, p99 {percentile(times, 99):.1f} ms"


async def stops(claude: Path, workdir: Path, cgroup_parent: str, count: int) -> None:
    for name, switches in SCENARIOS.items():
        spawns: list[float] = []
        latencies: list[float] = []
        for _ in range(count):
            spawn, stop = await one_stop(claude, switches, workdir, cgroup_parent)
            spawns.append(spawn)
            latencies.append(stop)
        ms = [x * 1000 for x in latencies]
        sp = [x * 1000 for x in spawns]
        print(
            f"  {name:<20} {percentile(ms, 50):>8.1f}ms {percentile(ms, 99):>8.1f}ms"
            f" {max(ms):>8.1f}ms {percentile(sp, 50):>8.1f}ms {percentile(sp, 99):>8.1f}ms",
            flush=True,
        )


async def main(count: int, crowded: int) -> None:
    groups = probe("auto", limits=False)
    containments = [("no cgroup: the supervisor scans /proc", "")]
    if groups.groups:
        containments.append(("own cgroup: the group lists the run", "auto"))
    else:
        print(f"(no cgroup per run here: {groups.problem})")
    print(f"fake claude via {sys.executable}; stop_grace_s = {STOP_GRACE_S}; {count} stops each")
    header = f"  {'scenario':<20} {'stop p50':>10} {'stop p99':>10} {'stop max':>10}"
    header += f" {'spawn p50':>10} {'spawn p99':>10}"
    with tempfile.TemporaryDirectory(prefix="bench-stop-") as tmp:
        claude = install(Path(tmp))
        for target in (0, crowded):
            async with crowd(target) as processes:
                print(f"\n{processes} processes on the host; one /proc scan: {scan_cost()}")
                for label, cgroup_parent in containments:
                    print(f"{label}\n{header}\n  {'-' * (len(header) - 2)}", flush=True)
                    await stops(claude, Path(tmp), cgroup_parent, count)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, default=15)
    parser.add_argument("--crowd", type=int, default=CROWD, help="host processes, crowded run")
    args = parser.parse_args()
    asyncio.run(main(args.stops, args.crowd))

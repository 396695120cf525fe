"""claude's output through the run's supervisor (journal + socket) against a direct pipe.

Since issue 11 the bridge no longer reads claude's stdout pipe: the run's
supervisor reads it, appends it to the run's journal and ``sendfile``s the
journal to the bridge over a Unix socket (docs/detached-runs.md). This
measures what that relay costs, against the pipe the bridge read before:

- added latency per line: a "claude" (a small script) prints a line stamped
  with ``time.monotonic_ns()`` (one clock for every process of the host)
  every 0.5 ms and flushes it, as claude does; the bridge side takes the
  time when it has framed the line;
- lines per second: 100-byte lines as fast as the script prints them;
- MB/s: 64 KiB lines (a tool result holding a file).

The bridge side is the runner's own reader either way, up to framed lines
(``Supervised.read`` and ``LineFramer`` over the socket; ``StreamReader.read``
and ``LineFramer`` over the pipe); decoding stream-json costs the same on
both and is left out. Paths alternate, so both see the same machine load.

    .venv/bin/python bench/bench_relay.py [--lines N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge.core.model import RunId  # noqa: E402
from runner import RunRequest, supervision  # noqa: E402
from runner.rundir import make_run_dir, remove_run_dir  # noqa: E402
from runner.stream import LineFramer  # noqa: E402

EMITTER = r"""
import sys, time
count, size, gap = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
out = sys.stdout.buffer
pad = b"x" * size
for _ in range(count):
    out.write(b'{"type":"bench","t":%d,"pad":"%s"}\n' % (time.monotonic_ns(), pad))
    out.flush()
    if gap:
        time.sleep(gap)
"""
GAP_S = 0.0005
SMALL = 100
BIG = 64 * 1024
CAP = 16 * 1024 * 1024


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def stamp(line: bytes) -> int:
    start = line.index(b'"t":') + 4
    return int(line[start : line.index(b",", start)])


async def via_pipe(argv: list[str]) -> AsyncIterator[bytes]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    while chunk := await proc.stdout.read(256 * 1024):
        yield chunk
    await proc.wait()


async def via_supervisor(argv: list[str], state_dir: Path) -> AsyncIterator[bytes]:
    run_id = RunId(f"bench-{uuid.uuid4()}")
    request = RunRequest(
        run_id=run_id,
        claude_bin=argv[0],
        cwd=state_dir,
        prompt="",
        session_id=None,
        state_dir=state_dir,
        spool_max_bytes=1 << 40,
        max_line_bytes=CAP,
    )
    run_dir = make_run_dir(state_dir, run_id)
    supervised = await supervision.start(
        request,
        argv,
        env=dict(os.environ),
        run_dir=run_dir,
        limits=supervision.RunLimits(),
        first=b"",
    )
    try:
        while (record := await supervised.read()) is not None:
            if record.kind == "out":
                yield record.payload
    finally:
        await supervised.close()
        remove_run_dir(run_dir)


async def measure(chunks: AsyncIterator[bytes]) -> tuple[list[float], int, int, float]:
    """Per-line latency (ms), lines, bytes, and seconds from the first line to the last."""
    framer = LineFramer(CAP)
    latencies: list[float] = []
    size = 0
    first = last = 0
    async for chunk in chunks:
        now = time.monotonic_ns()
        for line in framer.feed(chunk):
            latencies.append((now - stamp(line)) / 1e6)
            size += len(line) + 1
            first = first or now
            last = now
    return latencies, len(latencies), size, (last - first) / 1e9


async def main(lines: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as tmp:
        emitter = Path(tmp) / "emit.py"
        emitter.write_text(EMITTER)
        state_dir = Path(tmp) / "state"

        def argv(count: int, size: int, gap: float) -> list[str]:
            return [sys.executable, "-I", "-S", str(emitter), str(count), str(size), str(gap)]

        paths: dict[str, Callable[[list[str]], AsyncIterator[bytes]]] = {
            "pipe": via_pipe,
            "supervisor": lambda a: via_supervisor(a, state_dir),
        }
        print(f"{rounds} round(s) per path, paths alternating; latency: {lines} lines, one per "
              f"{GAP_S * 1000:g} ms")  # fmt: skip
        latency: dict[str, list[float]] = {name: [] for name in paths}
        rate: dict[str, list[float]] = {name: [] for name in paths}
        mbps: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(rounds):
            for name, path in paths.items():
                got, count, _, _ = await measure(path(argv(lines, SMALL, GAP_S)))
                assert count == lines
                latency[name] += got
                _, count, _, seconds = await measure(path(argv(200_000, SMALL, 0)))
                rate[name].append(count / seconds)
                _, _, size, seconds = await measure(path(argv(2_000, BIG, 0)))
                mbps[name].append(size / seconds / 1e6)

        print("\nlatency per line, print to framed (ms)")
        print(f"  {'':<12}{'p50':>8}{'p90':>8}{'p99':>8}")
        for name, values in latency.items():
            cells = "".join(f"{percentile(values, p):8.3f}" for p in (50, 90, 99))
            print(f"  {name:<12}{cells}")
        added = "".join(
            f"{percentile(latency['supervisor'], p) - percentile(latency['pipe'], p):8.3f}"
            for p in (50, 90, 99)
        )
        print(f"  {'added':<12}{added}")
        print("\nthroughput (median of rounds)")
        print(f"  {'':<12}{'lines/s':>12}{'MB/s':>10}")
        for name in paths:
            print(
                f"  {name:<12}{percentile(rate[name], 50):12,.0f}{percentile(mbps[name], 50):10.0f}"
            )
        ratio_rate = percentile(rate["supervisor"], 50) / percentile(rate["pipe"], 50)
        ratio_mb = percentile(mbps["supervisor"], 50) / percentile(mbps["pipe"], 50)
        print(f"  {'ratio':<12}{ratio_rate:12.2f}{ratio_mb:10.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=3000, help="lines per latency round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.lines, args.rounds))

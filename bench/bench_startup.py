"""Start-up: ``chatbridge --version``, and ``chatbridge run`` until it logs "chatbridge ready".

The run is the console room on the embedded defaults (plus a temp SQLite
database and HTTP off), as ``make run`` starts it; the clock stops at the
ready line, then end of input lets the service exit.

    python bench/bench_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHATBRIDGE = Path(sys.executable).parent / "chatbridge"
READY_LINE = b"chatbridge ready"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBRIDGE_")}
    env.update(extra)
    return env


def version_once() -> float:
    start = time.perf_counter()
    subprocess.run([str(CHATBRIDGE), "--version"], check=True, capture_output=True)
    return (time.perf_counter() - start) * 1000


def console_ready_once(tmp: Path) -> float:
    env = clean_env(
        CHATBRIDGE_DATABASE__URL=f"sqlite+aiosqlite:///{tmp / 'bench.db'}",
        CHATBRIDGE_HTTP__LISTEN="",
    )
    start = time.perf_counter()
    process = subprocess.Popen(
        [str(CHATBRIDGE), "run"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp,
    )
    assert process.stderr is not None
    assert process.stdin is not None
    ready = None
    for line in process.stderr:
        if READY_LINE in line:
            ready = time.perf_counter()
            break
    process.stdin.close()
    process.stderr.read()
    if process.wait(timeout=30) != 0 or ready is None:
        raise SystemExit(f"chatbridge run failed (exit {process.returncode})")
    return (ready - start) * 1000


def show(name: str, samples: list[float]) -> None:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    print(f"{name:28} p50 {cuts[49]:7.1f}  p90 {cuts[89]:7.1f}  max {max(samples):7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    print(f"start-up, ms ({args.runs} runs each)")
    show("chatbridge --version", [version_once() for _ in range(args.runs)])
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        show("chatbridge run → ready", [console_ready_once(Path(tmp)) for _ in range(args.runs)])


if __name__ == "__main__":
    main()

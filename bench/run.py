"""Every benchmark in one run: ``python bench/run.py``.

Prints start-up time (bench_startup), a Matrix ping to its answer against a
bare echo bot on the same Synapse (bench_ping), the same for Slack Socket Mode
on local-slack (bench_slack_ping), claude's result line to the answer with 20
runs ending at once (bench_run_end), dispatcher overhead per flush (from the
window's deadline) and memory per room, idle and at its busy peak
(bench_dispatcher), stop latency until the whole process tree is gone with
~100 and ~1,100 processes on the host (bench_stop), messages/s accepted
across 1,000 rooms through the whole accept path, acceptors interleaving
(bench_intake) and the store: accept rates, a run's store calls, reads beside
writes and 20 runs ending at once (bench_store), and claude's output relayed
through the run's supervisor against a direct pipe (bench_relay); replicas on
one PostgreSQL: throughput with 1, 2 and 3 replica processes, failover after
``kill -9`` and a command accepted on one replica acting on another
(bench_cluster); how late the window's timer wakes (bench_timer); and the
headline with the real claude CLI: a message to its answer through chatbridge
(console) against ``claude -p`` run directly, the sign of life and memory
(bench_headline; ``--matrix`` adds Synapse and an echo bot), and the bridge's RSS
with 1,000 configured rooms and 100 active (bench_rooms_memory).
Figures are recorded in docs/performance.md.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
BENCHES = [
    "bench_startup.py",
    "bench_ping.py",
    "bench_run_end.py",
    "bench_slack_ping.py",
    "bench_dispatcher.py",
    "bench_timer.py",
    "bench_headline.py",
    "bench_rooms_memory.py",
    "bench_stop.py",
    "bench_intake.py",
    "bench_store.py",
    "bench_relay.py",
    "bench_cluster.py",
]


def main() -> int:
    failed = 0
    for name in BENCHES:
        print(f"\n=== {name}", flush=True)
        start = time.perf_counter()
        code = subprocess.call([sys.executable, str(HERE / name)])
        print(f"--- {name}: exit {code}, {time.perf_counter() - start:.1f}s", flush=True)
        failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Start-up: ``chatbridge --version``, and ``chatbridge run`` until it logs "chatbridge ready".

Three configurations, each a fresh ``chatbridge run`` process timed from
spawn to its ready line, then stopped with SIGTERM:

- console: the embedded defaults (console room, SQLite, HTTP on), as ``make run``
  starts it, with a temp database already migrated by a first, uncounted start;
- Matrix: a real Synapse, the bot's device saved by a first, uncounted start
  (so each counted start logs in with the saved token and does its first sync);
- Slack: local-slack in Socket Mode (``auth.test``, ``apps.connections.open``
  and the websocket hello).

local-slack listens on every interface, so the bench re-runs itself in a
private network namespace (``unshare -n``, root) when it is not in one;
without that the Slack line is skipped.

    python bench/bench_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from tests.transports.matrix.matrix_service import config_toml as matrix_config
from tests.transports.matrix.synapse_peer import SynapseServer, synapse_python
from tests.transports.slack import peer
from tests.transports.slack.service import config_toml as slack_config

CHATBRIDGE = Path(sys.executable).parent / "chatbridge"
READY_LINE = b"chatbridge ready"
NETNS_ENV = "CHATBRIDGE_BENCH_IN_NETNS"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBRIDGE_")}
    env.update(extra)
    return env


def version_once() -> float:
    start = time.perf_counter()
    subprocess.run([str(CHATBRIDGE), "--version"], check=True, capture_output=True)
    return (time.perf_counter() - start) * 1000


Sample = tuple[float, float]
"""(wall ms, CPU ms of the process) until the ready line."""


def cpu_ms(pid: int) -> float:
    """User + system CPU ms of ``pid`` so far: less sensitive to a busy machine than wall time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def ready_once(args: list[str], env: Mapping[str, str], cwd: Path) -> Sample:
    """Spawn ``chatbridge run ARGS``; time until its ready line; then SIGTERM and reap it."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [str(CHATBRIDGE), "run", *args],
        stdin=subprocess.PIPE,  # open: the console must not see end of input
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
    )
    assert process.stderr is not None
    ready = None
    cpu = 0.0
    log: list[bytes] = []
    for line in process.stderr:
        log.append(line)
        if READY_LINE in line:
            ready = time.perf_counter()
            cpu = cpu_ms(process.pid)
            break
    process.send_signal(signal.SIGTERM)
    log.append(process.stderr.read())
    code = process.wait(timeout=60)
    if ready is None or code != 0:
        tail = b"".join(log[-10:]).decode(errors="replace")
        raise SystemExit(f"chatbridge run failed (exit {code}):\n{tail}")
    return (ready - start) * 1000, cpu


def console_samples(runs: int, tmp: Path) -> list[Sample]:
    env = clean_env(
        CHATBRIDGE_DATABASE__URL=f"sqlite+aiosqlite:///{tmp / 'console.db'}",
        CHATBRIDGE_HTTP__LISTEN="127.0.0.1:0",
    )
    ready_once([], env, tmp)  # creates the schema: not a typical start
    return [ready_once([], env, tmp) for _ in range(runs)]


def matrix_samples(runs: int, tmp: Path) -> list[Sample] | str:
    python = synapse_python()
    if python is None:
        return "Synapse is not installed (make peers)"
    synapse = SynapseServer(python, tmp / "synapse")
    (tmp / "synapse").mkdir()
    synapse.configure()
    synapse.start()
    try:
        human = synapse.register("human")
        bot = synapse.register("bridge")
        work = tmp / "matrix"
        work.mkdir()
        config = work / "chatbridge.toml"
        config.write_text(
            matrix_config(
                work,
                synapse=synapse,
                bot=bot,
                room_id="!unused:localhost",
                allowed=(human.user_id,),
                matrix_extra={},
            )
        )
        env = clean_env(CHATBRIDGE_MATRIX__PASSWORD=bot.password)
        args = ["--config", str(config)]
        ready_once(args, env, work)  # password login, device saved, schema created
        return [ready_once(args, env, work) for _ in range(runs)]
    finally:
        synapse.stop()


def slack_samples(runs: int, tmp: Path) -> list[Sample] | str:
    if not peer.binary().is_file():
        return f"local-slack is not installed ({peer.INSTALL_HINT})"
    if reason := peer.private_network_reason():
        return f"not in a private network namespace: {reason}"
    work = tmp / "slack"
    work.mkdir()

    async def measure() -> list[Sample]:
        async with peer.run_local_slack(work, "socket") as slack:
            config = work / "chatbridge.toml"
            config.write_text(slack_config(work, slack, (peer.ALICE,), {}))
            env = clean_env(
                CHATBRIDGE_SLACK__BOT_TOKEN=peer.BOT_TOKEN,
                CHATBRIDGE_SLACK__APP_TOKEN=peer.APP_TOKEN,
                CHATBRIDGE_SLACK__SIGNING_SECRET=peer.SIGNING_SECRET,
            )
            args = ["--config", str(config)]
            # Blocking waits in a thread: local-slack is served by this loop's drain task.
            await asyncio.to_thread(ready_once, args, env, work)
            return [await asyncio.to_thread(ready_once, args, env, work) for _ in range(runs)]

    return asyncio.run(measure())


def show(name: str, samples: list[float] | list[Sample] | str) -> None:
    if isinstance(samples, str):
        print(f"{name:32} skipped: {samples}")
        return
    walls = [s if isinstance(s, float) else s[0] for s in samples]
    cuts = statistics.quantiles(walls, n=100, method="inclusive")
    line = f"{name:32} p50 {cuts[49]:7.1f}  p90 {cuts[89]:7.1f}  max {max(walls):7.1f}"
    cpus = [s[1] for s in samples if not isinstance(s, float)]
    if cpus:
        line += f"  | CPU p50 {statistics.median(cpus):6.0f}"
    print(line)


def reexec_in_private_network() -> None:
    """Run this bench again inside ``unshare -n`` (loopback only) when it can."""
    if os.environ.get(NETNS_ENV) or peer.private_network_reason() is None:
        return
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return
    script = 'ip link set lo up && exec "$0" "$@"'
    argv = ["unshare", "-n", "sh", "-c", script, sys.executable, *sys.argv]
    raise SystemExit(subprocess.call(argv, env={**os.environ, NETNS_ENV: "1"}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    reexec_in_private_network()
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"start-up, ms ({args.runs} runs each; load average {load})")
    show("chatbridge --version", [version_once() for _ in range(args.runs)])
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as name:
        tmp = Path(name)
        show("run → ready: console (defaults)", console_samples(args.runs, tmp))
        show("run → ready: Matrix (Synapse)", matrix_samples(args.runs, tmp))
        show("run → ready: Slack (local-slack)", slack_samples(args.runs, tmp))


if __name__ == "__main__":
    main()

"""Reattach after a restart: 50 live runs, a new service, until every run is followed again.

The whole service in-process (recovery, dispatcher, runner, the runs' detached
supervisors) with a transport that stands in for Matrix (bench/bench_run_end.py's
``Rooms``), SQLite on disk, and the fake claude (tests/fakes/fake_claude.py),
which prints its first lines and then waits for a trigger file. Phase one
starts one run per room and shuts down with ``on_shutdown = "detach"``: the
runs go on under their supervisors. Phase two starts a new service on the
same database and state directory, the way a restart does.

Printed: the time from the new service's start (recovery included) until
each room is shown its run as running again (the run is reattached: its
supervisor answered, its journal is being replayed, its registry entry is
written again), p50/p90/max and until the last one; then how long after the
trigger every answer was delivered, once each.

    python bench/bench_reattach.py [--rooms 50] [--rounds 3]
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

from bench_run_end import Rooms, at_least, room_key, settings

from bridge.config import Settings
from bridge.service import Service
from bridge.store.sql import SqlStore

GUARD_S = 120.0


def detaching(config: Settings, state: Path) -> Settings:
    runner = config.runner.model_copy(update={"on_shutdown": "detach", "state_dir": state})
    return config.model_copy(update={"runner": runner})


async def one_round(tmp: Path, rooms: int) -> tuple[list[float], float, float]:
    trigger = tmp / "answer-now"
    config = detaching(settings(tmp, rooms, trigger, tmp / "times.jsonl", 0.0), tmp / "state")
    url = f"sqlite+aiosqlite:///{tmp / 'bridge.db'}"

    store = await SqlStore.open(url)
    try:
        first = Rooms()
        service = Service(config, store, [first])
        async with asyncio.timeout(GUARD_S), asyncio.TaskGroup() as tasks:
            serving = tasks.create_task(service.serve())
            await service.ready.wait()
            for i in range(rooms):
                await first.say(room_key(i), f"job in room {i}")
            await first.until(at_least(first.running, rooms))  # each registered, then shown
            service.request_stop()
            await serving
    finally:
        await store.close()

    store = await SqlStore.open(url)
    try:
        again = Rooms()
        shown: dict[int, float] = {}
        service = Service(config, store, [again])
        start = time.monotonic()
        async with asyncio.timeout(GUARD_S), asyncio.TaskGroup() as tasks:
            serving = tasks.create_task(service.serve())
            while len(shown) < rooms:
                again.changed.clear()
                for i in range(rooms):
                    if i not in shown and again.running.get(room_key(i)):
                        shown[i] = time.monotonic() - start
                if len(shown) < rooms:
                    await again.changed.wait()
            all_shown = time.monotonic() - start
            released = time.monotonic()
            trigger.touch()
            await again.until(lambda: len(again.answers) >= rooms)
            answered = time.monotonic() - released
            service.request_stop()
            await serving
        if len(again.answers) != rooms:
            raise AssertionError(f"{len(again.answers)} answers for {rooms} runs")
    finally:
        await store.close()
    return list(shown.values()), all_shown, answered


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


async def bench(rooms: int, rounds: int) -> None:
    print(f"{rooms} live runs reattached by a restarted service, {rounds} rounds (SQLite on disk)")
    each: list[float] = []
    last: list[float] = []
    answers: list[float] = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench-reattach-") as tmp_name:
            shown, all_shown, answered = await one_round(Path(tmp_name), rooms)
        each += shown
        last.append(all_shown)
        answers.append(answered)
    cuts = statistics.quantiles(each, n=100, method="inclusive")
    print(
        f"  start -> a run shown running again: p50 {ms(cuts[49])}  p90 {ms(cuts[89])}"
        f"  max {ms(max(each))}"
    )
    print(f"  start -> all {rooms} reattached:      median {ms(statistics.median(last))}")
    print(f"  trigger -> all {rooms} answers:        median {ms(statistics.median(answers))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rooms", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(bench(args.rooms, args.rounds))


if __name__ == "__main__":
    main()

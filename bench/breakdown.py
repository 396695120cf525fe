"""Where a ping's time goes: the stages between a user's message and its answer.

The service logs ``stage NAME T`` at DEBUG (:mod:`bridge.core.stages`) and
the fake claude writes its own times (``FAKE_CLAUDE_TIMES``), all on
``time.monotonic`` (one clock for every process of the host on Linux); the
benchmark adds when it sent the ping and when the user saw the answer. Pings
are sequential, so a stamp belongs to the ping whose [sent, seen] holds it.
A step's time may be negative: the fake claude stamps its result line after
flushing it, the bridge may have read it before that. The table gives each
step's p50 and its share of the p50 total: the machine may be loaded, the
proportions travel better than the milliseconds.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MILESTONES = (
    ("sent", "the user sends the ping (HTTP request starts)"),
    ("received", "the bridge's receive returns with it"),
    ("accepted", "accepted: committed to the store"),
    ("dispatched", "window closed: the run starts"),
    ("start_recorded", "start_run committed"),
    ("spawn", "supervisor exec requested"),
    ("supervisor_forked", "supervisor forked (exec returned)"),
    ("claude_spawned", "supervisor says claude is spawned"),
    ("prompt_sent", "prestarted: the prompt handed to the waiting claude"),
    ("fake_start", "fake claude's Python is up"),
    ("fake_result", "fake claude flushed its result line"),
    ("result_read", "the bridge parsed the result line"),
    ("registered", "the run is in the registry of live runs (synced)"),
    ("finishing", "finish_run called (its answer ready)"),
    ("outcome_recorded", "finish_run committed"),
    ("sending_result", "the outbox hands the answer to the transport"),
    ("history_looked_up", "Slack: history searched for parts already posted"),
    ("request_started", "Matrix: rendered, the PUT starts"),
    ("sent_result", "answer sent (HTTP request done)"),
    ("seen", "the answer in the user's sync"),
)

_RUN_STAGES = frozenset(name for name, _ in MILESTONES[4:-1])
"""What happens once the run started (``dispatched``): the bench's own ``seen`` aside."""

_STAGE = re.compile(r"stage (\w+) (\d+\.\d+)$")


@dataclass(frozen=True)
class Ping:
    sent: float
    seen: float


def stamps(log: Iterable[str], fake_times: Path) -> list[tuple[float, str]]:
    """Every stamp of the service's log and of the fake claude's file, in time order."""
    found: list[tuple[float, str]] = []
    for line in log:
        match = _STAGE.search(line)
        if match:
            found.append((float(match[2]), match[1]))
    if fake_times.exists():
        for line in fake_times.read_text().splitlines():
            record = json.loads(line)
            found.append((float(record["start"]), "fake_start"))
            if record.get("result") is not None:
                found.append((float(record["result"]), "fake_result"))
    return sorted(found)


def per_ping(pings: list[Ping], found: list[tuple[float, str]]) -> list[dict[str, float]]:
    """Each ping's milestones: the first stamp of each name in the ping's time.

    A ping's time runs from its sending to the next ping's: the bridge may
    hear back from its last request after the user saw the answer (Slack's
    client sees a post before the poster's HTTP response). The run's stamps
    count only from its ``dispatched`` on, so such a late stamp of the
    previous run (landing just after this ping was sent) is not taken for
    this run's.
    """
    rows = []
    ends = [ping.sent for ping in pings[1:]] + [float("inf")]
    for ping, end in zip(pings, ends, strict=True):
        row = {"sent": ping.sent, "seen": ping.seen}
        for at, name in found:
            if name in row or not ping.sent <= at < end:
                continue
            if name in _RUN_STAGES and at < row.get("dispatched", end):
                continue
            row[name] = at
        rows.append(row)
    return rows


def report(rows: list[dict[str, float]]) -> None:
    names = [name for name, _ in MILESTONES if any(name in row for row in rows)]
    totals = [(row["seen"] - row["sent"]) * 1000 for row in rows]
    total50 = statistics.median(totals)
    print(f"breakdown of {len(rows)} pings (p50 per step, ms; share of the p50 total)")
    labels = dict(MILESTONES)
    for before, after in itertools.pairwise(names):
        steps = [(r[after] - r[before]) * 1000 for r in rows if before in r and after in r]
        if not steps:
            continue
        p50 = statistics.median(steps)
        print(f"  {p50:7.1f} {p50 / total50:6.1%}  {before} → {after}: {labels[after]}")
    print(f"  {total50:7.1f} 100.0%  sent → seen (p50 of the totals)")

"""What the fake claude's run log (``FAKE_CLAUDE_RUN_LOG``) says about a test's runs,
checked against what the chat sent: nothing lost, nothing run twice, never two
runs of one conversation at once.

Message texts carry their ids: ``<conversation>-<number>`` (``C0R03-0007``).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MESSAGE_ID = re.compile(r"\b(C0R\d+-\d{4})\b")


def message_text(conversation: str, number: int) -> str:
    return f"{conversation}-{number:04d}"


def conversation_of(message: str) -> str:
    return message.rsplit("-", 1)[0]


@dataclass
class Run:
    """One fake claude process."""

    pid: int
    cwd: str
    start: float
    overlap: bool
    tag: str = ""
    """The replica that started it (``FAKE_CLAUDE_RUN_TAG``)."""
    run: str = ""
    messages: list[str] = field(default_factory=list)
    given_prompt: bool = False
    """The fake logged a prompt (one without a message id counts too)."""
    end: float | None = None
    how: str | None = None

    @property
    def prompted(self) -> bool:
        """claude was given a prompt; a claude started ahead (a prestart) and never given
        one runs nothing, so it is no run of its conversation."""
        return self.given_prompt or bool(self.messages)


def read_runs(path: Path) -> list[Run]:
    runs: dict[int, Run] = {}
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        pid = int(entry["pid"])
        if entry["event"] == "start":
            runs[pid] = Run(
                pid,
                entry["cwd"],
                float(entry["t"]),
                bool(entry["overlap"]),
                str(entry.get("tag", "")),
                str(entry.get("run", "")),
            )
        elif entry["event"] == "prompt":
            runs[pid].given_prompt = True
            runs[pid].messages += MESSAGE_ID.findall(entry["text"])
        elif entry["event"] == "end":
            runs[pid].end = float(entry["t"])
            runs[pid].how = entry["how"]
    return sorted(runs.values(), key=lambda r: r.start)


@dataclass
class Verdict:
    runs: list[Run]
    lost: list[str]
    twice: dict[str, list[int]]
    overlapping: list[tuple[int, int]]
    first_run: dict[str, float]
    """Each message's first run's start (``time.time()``)."""
    reported_unrun: list[str] = field(default_factory=list)
    """Never ran, but in a run the bridge recorded (and reported) as interrupted or
    failed (whose claude never started: see SlackCluster.check): not lost
    silently, but not run either."""

    def problems(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} accepted message(s) never ran: {self.lost[:20]}")
        if self.twice:
            some = dict(list(self.twice.items())[:10])
            out.append(f"{len(self.twice)} message(s) ran more than once (pids): {some}")
        if self.overlapping:
            pairs = [(self.by_pid(a), self.by_pid(b)) for a, b in self.overlapping[:5]]
            out.append(
                f"{len(self.overlapping)} overlapping run pair(s) of one conversation: {pairs}"
            )
        return out

    def by_pid(self, pid: int) -> str:
        run = next(r for r in self.runs if r.pid == pid)
        return (
            f"pid {pid} on {run.tag} run {run.run} in {Path(run.cwd).name}"
            f" {run.start:.3f}..{run.end} {run.how} {run.messages}"
        )


def check(runs: list[Run], accepted: Iterable[str], interrupted: Iterable[str] = ()) -> Verdict:
    """``accepted``: the message texts the bridge recorded (its inbox); ``interrupted``:
    those of them in a run the bridge recorded as interrupted or failed."""
    where: dict[str, list[int]] = defaultdict(list)
    for run in runs:
        for message in run.messages:
            where[message].append(run.pid)
    never = sorted(m for m in set(accepted) if m not in where)
    lost = [m for m in never if m not in set(interrupted)]
    reported_unrun = [m for m in never if m in set(interrupted)]
    twice = {m: pids for m, pids in where.items() if len(pids) > 1}
    overlapping: list[tuple[int, int]] = []
    # The lock the fake claude takes says it exactly; the times say it again for
    # runs that ended with a line (a SIGKILLed one has none: the lock covers it).
    by_cwd: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_cwd[run.cwd].append(run)
    for same in by_cwd.values():
        for i, later in enumerate(same):
            if not later.prompted:
                continue
            live = [r for r in same[:i] if r.end is None or r.end > later.start]
            earlier = [r for r in same[:i] if r.prompted]
            clash = [r for r in earlier if r.end is not None and r.end > later.start]
            if later.overlap and not clash:
                clash = [r for r in earlier if r.end is None or r.end > later.start][-1:]
            overlapping += [(r.pid, later.pid) for r in clash]
            # The lock may be held by a claude started ahead that never had a prompt
            # (a paused or killed replica's prestart): idle, it runs nothing.
            if later.overlap and not clash and not any(not r.prompted for r in live):
                overlapping.append((later.pid, later.pid))
    first = {m: min(r.start for r in runs if r.pid in pids) for m, pids in where.items()}
    return Verdict(runs, lost, twice, overlapping, first, reported_unrun)


def assert_invariants(
    runs: list[Run],
    accepted: Iterable[str],
    context: Mapping[str, str],
    interrupted: Iterable[str] = (),
) -> Verdict:
    """Fail with every problem and the replicas' log tails (``context``: name -> tail)."""
    verdict = check(runs, accepted, interrupted)
    problems = verdict.problems()
    if problems:
        tails = "\n".join(f"=== {name}\n{tail}" for name, tail in context.items())
        raise AssertionError("\n".join(problems) + "\n" + tails)
    return verdict

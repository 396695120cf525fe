"""The replica suite's checker can fail: lost, twice and overlapping runs are found,
from the fake claude's own run log (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fakes.fake_claude import FAKE_CLAUDE
from tests.replicas.invariants import Run, check, read_runs

STREAM = ["-p", "--output-format", "stream-json", "--input-format", "stream-json", "--verbose"]


def start_fake(cwd: Path, log: Path, text: str, gate: Path) -> subprocess.Popen[bytes]:
    """A streaming fake claude whose tool waits for ``gate``; its message is ``text``."""
    env = {
        **os.environ,
        "FAKE_CLAUDE_RUN_LOG": str(log),
        "FAKE_CLAUDE_RUN_TAG": "r9",
        "FAKE_CLAUDE_TOOL_WAIT_FOR": str(gate),
    }
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_CLAUDE), *STREAM],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    message = {"type": "user", "message": {"role": "user", "content": text}}
    proc.stdin.write((json.dumps(message) + "\n").encode())
    proc.stdin.flush()
    return proc


def wait_for_prompts(log: Path, count: int) -> None:
    """Until ``count`` prompt lines are logged (each process logs its own)."""
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count('"event": "prompt"') >= count:
            return
        time.sleep(0.02)  # another process writes the file: no event to wait on
    raise AssertionError(f"no {count} prompts in {log}")


def test_two_live_runs_of_one_working_directory_are_an_overlap(tmp_path: Path) -> None:
    room, other = tmp_path / "C0R01", tmp_path / "C0R02"
    room.mkdir()
    other.mkdir()
    log, gate = tmp_path / "runs.jsonl", tmp_path / "gate"
    procs = [
        start_fake(room, log, "C0R01-0000", gate),
        start_fake(other, log, "C0R02-0000", gate),
    ]
    wait_for_prompts(log, 2)
    procs.append(start_fake(room, log, "C0R01-0001", gate))
    wait_for_prompts(log, 3)
    # The first one dies as a SIGKILL leaves it: no end line, its lock released.
    procs[0].kill()
    procs.append(start_fake(room, log, "C0R01-0002", gate))
    wait_for_prompts(log, 4)
    gate.touch()
    for proc in procs[1:]:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=20) == 0
    procs[0].wait(timeout=20)
    assert procs[0].stdin is not None
    procs[0].stdin.close()
    runs = {r.messages[0]: r for r in read_runs(log)}
    first, second, third = (runs[f"C0R01-000{i}"] for i in range(3))
    assert not first.overlap
    assert not runs["C0R02-0000"].overlap  # another working directory
    assert second.overlap  # the first was alive
    assert third.overlap  # the first was dead, the second alive
    assert first.end is None
    assert {r.how for r in runs.values() if r is not first} == {"exit"}
    assert {r.tag for r in runs.values()} == {"r9"}
    sent = ["C0R01-0000", "C0R01-0001", "C0R01-0002", "C0R02-0000", "C0R03-0000"]
    verdict = check(list(runs.values()), sent)
    assert verdict.lost == ["C0R03-0000"]
    assert verdict.twice == {}
    pairs = set(verdict.overlapping)
    assert (second.pid, third.pid) in pairs
    assert (first.pid, second.pid) in pairs
    assert not any(runs["C0R02-0000"].pid in pair for pair in pairs)


def test_a_message_in_two_runs_is_run_twice_and_interrupted_ones_are_told_apart() -> None:
    one = Run(1, "/r/C0R01", 1.0, False, messages=["C0R01-0000"], end=2.0, how="exit")
    two = Run(2, "/r/C0R01", 3.0, False, messages=["C0R01-0000", "C0R01-0001"], end=4.0)
    verdict = check([one, two], ["C0R01-0000", "C0R01-0001", "C0R01-0002"], ["C0R01-0002"])
    assert verdict.twice == {"C0R01-0000": [1, 2]}
    assert verdict.overlapping == []
    assert verdict.lost == []
    assert verdict.reported_unrun == ["C0R01-0002"]
    assert "more than once" in verdict.problems()[0]


def test_a_claude_started_ahead_and_never_prompted_is_no_run_of_its_conversation() -> None:
    """An idle prestart (a paused or killed replica's) holds the conversation's lock but
    runs nothing: the new owner's run beside it is not two runs; two prompted ones are."""
    idle = Run(1, "/w/C1", 10.0, False, "r1", "run-a", end=20.0, how="sigterm")
    owner = Run(2, "/w/C1", 12.0, True, "r2", "run-b", ["C1-0001"], end=13.0, how="exit")
    assert check([idle, owner], ["C1-0001"]).overlapping == []
    busy = Run(1, "/w/C1", 10.0, False, "r1", "run-a", ["C1-0001"], end=20.0, how="sigterm")
    other = Run(2, "/w/C1", 12.0, True, "r2", "run-b", ["C1-0002"], end=13.0, how="exit")
    assert check([busy, other], ["C1-0001", "C1-0002"]).overlapping == [(1, 2)]

"""What a run left marked running by a dead process had got to."""

from __future__ import annotations

from pathlib import Path

from bridge.store.base import RegisteredRun, RunRecord
from runner import run_dir_made


def never_started(run: RunRecord, entry: RegisteredRun | None, state_dir: Path) -> bool:
    """Whether a run left marked running never got as far as its supervisor: not
    registered (no pid recorded), and no run directory under the state directory
    of the process that started it (made before the supervisor is spawned, removed
    only once the outcome is recorded; an end that could not be recorded leaves it,
    emptied)."""
    return entry is None and run.pid is None and not run_dir_made(state_dir, run.id)

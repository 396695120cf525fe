"""Runs' private directories: ``<state_dir>/runs/<run id>/`` (docs/detached-runs.md).

Each holds the supervisor's socket and the run's journal. The bridge creates
it before the run, and removes it once the run ended and the room was told.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bridge.core.model import LiveRun, RunId
from runner.supervisor import JOURNAL

RUNS = "runs"
TEMP_PREFIX = "chatbridge-runs-"


def make_run_dir(state_dir: Path | None, run_id: RunId) -> Path:
    """Create the run's directory (and ``state_dir``, ``runs/``) mode 0700; return it.

    ``state_dir`` None: a fresh temporary directory stands in for it (tests).
    Raises OSError.
    """
    if state_dir is None:
        state_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    runs = state_dir / RUNS
    runs.mkdir(mode=0o700, exist_ok=True)
    run_dir = runs / run_id
    run_dir.mkdir(mode=0o700, exist_ok=True)
    return run_dir


def journal_exists(run: LiveRun) -> bool:
    """Whether the run's journal is still there (the bridge removes it once the run ended)."""
    return (Path(run.run_dir) / JOURNAL).is_file()


def remove_run_dir(run: LiveRun | Path | str) -> None:
    """Delete a run's directory (once its outcome is recorded); a missing one is fine.

    A temporary state directory made for it (``state_dir`` None) goes with it.
    """
    run_dir = Path(run.run_dir if isinstance(run, LiveRun) else run)
    shutil.rmtree(run_dir, ignore_errors=True)
    root = run_dir.parent.parent
    if root.name.startswith(TEMP_PREFIX) and root.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(root, ignore_errors=True)


def stray_runs(state_dir: Path, known: set[str]) -> list[Path]:
    """Run directories under ``state_dir`` whose run id is not in ``known``."""
    try:
        entries = list((state_dir / RUNS).iterdir())
    except OSError:
        return []
    return sorted(p for p in entries if p.is_dir() and p.name not in known)

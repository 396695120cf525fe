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


def interruption_text(run: RunRecord, replica: str | None, prefix: str) -> tuple[str, str]:
    """What the room is told of a run found left running, and the error it is recorded
    with: a run of another replica (``replica``: this one's id) was taken over because
    that replica stopped answering (a pause, a crash: docs/replicas.md); one of this
    process's own did not finish before it restarted."""
    retry = f"If its answer is not above, `{prefix}retry {run.id}` runs it again."
    if run.replica is not None and run.replica != replica:
        return (
            f"The last run (`{run.id}`) did not finish: replica `{run.replica}`, which ran"
            f" it, stopped answering, and another replica took the conversation over. {retry}",
            f"replica {run.replica} stopped answering during the run",
        )
    # Honest for both ways a run stays "running": a crash or restart during it, or an
    # end whose outcome the failing database could not take (its answer may have gone out).
    return (
        f"The last run (`{run.id}`) did not finish before chatbridge restarted"
        f" (or its end could not be recorded). {retry}",
        "chatbridge restarted during the run",
    )

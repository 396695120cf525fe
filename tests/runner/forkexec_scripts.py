"""Running a script through the runner's fork-exec and reading its result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def script_result(script: str, *args: str) -> dict[str, Any]:
    """What ``script`` prints (one JSON object), run in a fresh single-threaded Python."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result

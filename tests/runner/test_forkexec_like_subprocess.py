"""Review 2: runner.forkexec against subprocess, the way it replaced it (failing).

Each case runs in a single-threaded process of its own, as in test_forkexec.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.runner.forkexec_scripts import script_result

SPAWN_IN = """
import json, os, sys
from runner import forkexec
mode, cwd = sys.argv[1], sys.argv[2]
if mode == "popen":  # as where clone3 is refused
    forkexec._clone_exec = lambda *args: None
null = os.open("/dev/null", os.O_RDWR)
try:
    pid = forkexec.spawn(["/bin/true"], cwd, (null, null, null), None)
except OSError as exc:
    print(json.dumps({"errno": exc.errno, "filename": exc.filename}))
else:
    os.waitpid(pid, 0)
    print(json.dumps({"pid": pid}))
"""


def spawn_in(mode: str, cwd: str) -> dict[str, Any]:
    return script_result(SPAWN_IN, mode, cwd)


@pytest.mark.parametrize("mode", ["clone3", "popen"])
def test_a_working_directory_claude_cannot_enter_is_named_not_the_program(
    mode: str, tmp_path: Path
) -> None:
    # subprocess names the directory (its chdir failed); the clone3 child reports the
    # chdir's errno as the exec's, against argv[0]. The run then says "cannot start
    # claude claude: [Errno 13] Permission denied: 'claude'" for a repository the
    # bridge's user may not enter (run.py checks only that the directory exists), and
    # "[Errno 20] Not a directory: '/bin/true'" here.
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    result = spawn_in(mode, str(not_a_dir))
    assert result["errno"] == 20  # ENOTDIR
    assert result["filename"] == str(not_a_dir)

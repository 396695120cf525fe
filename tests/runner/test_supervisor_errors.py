"""The supervisor survives what it cannot do: a process it may not signal, a
cgroup claude cannot enter. Both run as an unprivileged user (the test runs
as root, which may signal and write anything), in a real child process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.spare import SUPERVISOR

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")

NOBODY = 65534
# Imports the supervisor as root, then becomes nobody: no file access needed after
# (subprocess too: the supervisor imports it only where clone3 is refused).
AS_NOBODY = """
import os, subprocess, sys
runner = type(sys)("runner")
runner.__path__ = [sys.argv[1]]
sys.modules["runner"] = runner
from runner import supervisor
os.setgroups([])
os.setgid({uid})
os.setuid({uid})
os.umask(0o277)
{code}
"""


def as_nobody(
    code: str, *args: str, pass_fds: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[str]:
    script = AS_NOBODY.format(uid=NOBODY, code=code)
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, str(SUPERVISOR.parent), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        pass_fds=pass_fds,
    )


@pytest.fixture
def nobodys_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        os.chown(name, NOBODY, NOBODY)
        yield Path(name)


def test_a_process_it_may_not_signal_does_not_end_the_stop() -> None:
    # A root process in the run (a setuid tool): the stop goes on past it.
    with subprocess.Popen(["sleep", "300"]) as rooted:
        try:
            result = as_nobody(
                "import signal\n"
                "target, parent = int(sys.argv[2]), int(sys.argv[3])\n"
                "print(supervisor.signal_all([target], (signal.SIGTERM,), {parent}))",
                str(rooted.pid),
                str(os.getpid()),
            )
            assert result.returncode == 0, result.stderr
            assert result.stdout.strip() == "1"
            assert rooted.poll() is None
        finally:
            rooted.kill()


def test_a_cgroup_claude_cannot_enter_runs_without_it(nobodys_dir: Path) -> None:
    # With umask 277 the run's group directory is read-only for its owner:
    # moving claude into it fails in the child, before exec.
    cgroups, run_dir = nobodys_dir / "cgroups", nobodys_dir / "run"
    for path in (cgroups, run_dir):
        path.mkdir(mode=0o700)
        os.chown(path, NOBODY, NOBODY)
    ours, theirs = socket.socketpair()
    with ours:
        ours.sendall(b'{"t":"attach","v":[1],"offset":0}\n{"t":"eof"}\n')
        with theirs:
            result = as_nobody(
                "sys.exit(supervisor.main(sys.argv[2:]))",
                "--run-id=run-enter",
                f"--run-dir={run_dir}",
                f"--cwd={run_dir}",
                f"--conn-fd={theirs.fileno()}",
                "--grace-s=1",
                "--run-timeout-s=60",
                "--idle-timeout-s=60",
                "--orphan-timeout-s=60",
                "--spool-max-bytes=1000000",
                "--max-line-bytes=1000000",
                f"--cgroup={cgroups}",
                "--",
                "/bin/true",
                pass_fds=(theirs.fileno(),),
            )
        received = b""
        while chunk := ours.recv(65536):
            received += chunk
    assert result.returncode == 0, result.stderr
    welcome, *lines = [json.loads(line) for line in received.splitlines()]
    assert welcome["t"] == "welcome"
    records = {line["t"]: line for line in lines}
    spawned = records["spawned"]
    assert spawned["cgroup"] is None
    assert "cannot move claude into" in spawned["cgroup_error"]
    assert records["exited"] == {"t": "exited", "code": 0}
    assert lines[-1] == {"t": "done", "survivors": []}
    assert list(cgroups.iterdir()) == []  # the group's directory was removed

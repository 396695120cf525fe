"""runner.forkexec: claude started by clone3 into its cgroup, or by subprocess where refused.

Each case runs in a process of its own, single-threaded as the supervisor is
(a clone3 from a threaded test process could copy a lock another thread holds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.proctree import cgroup_parent
from tests.runner.forkexec_scripts import ROOT, script_result

SPAWN = """
import json, os, signal, sys
from runner import forkexec
from runner.proctree import Cgroup

parent, run_id, mode, argv = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
if mode == "popen":  # as where clone3 is refused
    forkexec._clone_exec = lambda *args: None
elif mode == "clone3":  # as where it works: subprocess must not be needed
    def refuse(*args):
        raise AssertionError("subprocess used")
    forkexec._popen = refuse
result = {}
if mode == "watch":  # which way it went
    popen = forkexec._popen
    def watched(*args):
        result["popen"] = True
        return popen(*args)
    forkexec._popen = watched
cgroup = None
if parent:
    cgroup = Cgroup(parent, run_id)
    cgroup.create(None, None)
r, w = os.pipe()
leak = os.open("/dev/null", os.O_RDONLY)
os.set_inheritable(leak, True)  # as the supervisor's inherited connection
null = os.open("/dev/null", os.O_RDWR)
signal.signal(signal.SIGPIPE, signal.SIG_IGN)
try:
    pid = forkexec.spawn(argv, "/", (null, w, w), cgroup)
except OSError as exc:
    result["error"] = exc.errno
else:
    os.close(w)
    with os.fdopen(r) as out:
        text = out.read()
        result["child"] = json.loads(text) if text.startswith("{") else text
    result["pid"] = pid
    result["status"] = os.waitpid(pid, 0)[1]
finally:
    if cgroup is not None:
        cgroup.remove(5.0)
print(json.dumps(result))
"""

CHILD = """
import json, os
print(json.dumps({
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "sid": os.getsid(0), "pid": os.getpid(), "cwd": os.getcwd(),
    "cgroup": open("/proc/self/cgroup").read(),
}))
"""


def spawn(mode: str, *, parent: str = "", argv: list[str] | None = None) -> dict[str, Any]:
    argv = argv or [sys.executable, "-c", CHILD]
    run_id = f"forkexec-{os.getpid()}-{mode}"
    return script_result(SPAWN, parent, run_id, mode, json.dumps(argv))


def cgroups() -> str:
    try:
        return cgroup_parent("auto")
    except OSError:
        pytest.skip("no cgroup v2 group to make runs' groups under")


@pytest.mark.parametrize("mode", ["clone3", "popen"])
def test_the_program_runs_alone_in_a_session_of_its_own(mode: str) -> None:
    result = spawn(mode)
    child = result["child"]
    assert child["pid"] == result["pid"]
    assert child["sid"] == child["pid"]
    assert child["cwd"] == "/"
    # 0-2 and the fd listing itself: nothing of the supervisor's leaks in.
    assert child["fds"][:3] == [0, 1, 2]
    assert len(child["fds"]) == 4
    assert result["status"] == 0


@pytest.mark.parametrize("mode", ["clone3", "popen"])
def test_sigpipe_is_back_at_its_default(mode: str) -> None:
    # The parent (Python) ignores it; a program that is not Python expects the default.
    status = spawn(mode, argv=["/bin/cat", "/proc/self/status"])["child"]
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:"))[7:], 16)
    assert not ignored & (1 << (13 - 1))


@pytest.mark.parametrize("mode", ["clone3", "popen"])
def test_the_program_starts_in_its_cgroup(mode: str) -> None:
    parent = cgroups()
    result = spawn(mode, parent=parent)
    assert result["child"]["cgroup"].strip().endswith(f"/forkexec-{os.getpid()}-{mode}")
    assert result["status"] == 0


@pytest.mark.parametrize("mode", ["clone3", "popen"])
def test_a_program_that_cannot_start_is_an_oserror(mode: str, tmp_path: Path) -> None:
    assert spawn(mode, argv=[str(tmp_path / "missing")])["error"] == 2  # ENOENT
    not_executable = tmp_path / "plain"
    not_executable.write_text("")
    assert spawn(mode, argv=[str(not_executable)])["error"] == 13  # EACCES


def test_where_clone3_into_the_group_is_refused_subprocess_starts_it(tmp_path: Path) -> None:
    # A plain directory is no cgroup: clone3 refuses it, subprocess's move fails
    # in the child before exec, and the caller is told (it starts without a group).
    script = SPAWN.replace(
        "except OSError as exc:",
        "except forkexec.CgroupRefused:\n    result['refused'] = True\nexcept OSError as exc:",
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), "plain", "watch", json.dumps(["/bin/true"])],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    if os.geteuid() == 0:
        # root may write the plain directory's cgroup.procs file: the "move" works.
        assert json.loads(done.stdout)["status"] == 0, done.stderr
    else:
        assert json.loads(done.stdout)["refused"], done.stderr
    assert json.loads(done.stdout)["popen"]

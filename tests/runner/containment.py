"""Process-tree containment in the tests: probes, escaping children and waits for exits."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from bridge.core.model import RunId
from runner import RunRequest
from runner.cgroups import probe
from runner.process import wait_exited
from tests.runner.conftest import is_alive
from tests.runner.fake_runs import fake_env, make_request, record

ESCAPES = ("env-i", "double-fork", "background")


HERE = probe("auto", limits=False)


needs_cgroups = pytest.mark.skipif(not HERE.groups, reason=f"no cgroup groups: {HERE.problem}")


CGROUP_PARENTS = [
    pytest.param("", id="subreaper-only"),
    # The supervisor then finds the run's processes through the group, not /proc.
    pytest.param("auto", id="cgroup", marks=needs_cgroups),
]


def escaping_request(
    run_id: RunId, tmp_path: Path, cgroup_parent: str = "", **switches: str
) -> RunRequest:
    escape_dir = tmp_path / "escape"
    escape_dir.mkdir(exist_ok=True)
    env = fake_env(tmp_path, escape=str(escape_dir), **switches)
    return make_request(run_id, tmp_path, env=env, stop_grace_s=0.5, cgroup_parent=cgroup_parent)


def escaped(tmp_path: Path) -> list[int]:
    pids = [int((tmp_path / "escape" / f"{name}.pid").read_text()) for name in ESCAPES]
    assert record(tmp_path)["escaped"] == pids
    return pids


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if is_alive(pid)]


def ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def until_exited(pids: list[int], within: float = 30.0) -> None:
    """Wait for processes that are not our children to exit; TimeoutError if some do not."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            continue
    try:
        running = await wait_exited(fds, within)
    finally:
        for fd in fds:
            os.close(fd)
    if running:
        raise TimeoutError(f"{len(running)} process(es) still running after {within:g}s")


RUN_IN_CHILD = """
import asyncio, json, sys
from pathlib import Path
from runner import RunRequest, run_claude

async def main() -> None:
    cwd = Path(sys.argv[2])
    request = RunRequest(**json.loads(sys.argv[1]), cwd=cwd, state_dir=cwd / "state")
    async def on_event(event: object) -> None:
        print(type(event).__name__, flush=True)
    await run_claude(request, on_event)

asyncio.run(main())
"""


async def run_in_child_bridge(
    request: RunRequest, tmp_path: Path
) -> tuple[asyncio.subprocess.Process, list[int]]:
    """Start ``request`` in a child process standing in for the bridge; once its tools run,
    return that process and the run's pids (claude, its supervisor, the escaped tools)."""
    # The run's directory under the test's own: a killed bridge leaves it behind.
    fields = {k: v for k, v in request.__dict__.items() if k not in {"cwd", "state_dir"}}
    fields["env"] = dict(fields["env"])
    bridge = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RUN_IN_CHILD, json.dumps(fields), str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert bridge.stdout is not None
    while (line := await bridge.stdout.readline()) != b"ToolResult\n":
        assert line, "the run in the child ended early"
    claude = record(tmp_path)["pid"]
    return bridge, [claude, ppid(claude), *escaped(tmp_path)]

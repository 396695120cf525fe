"""Nothing escapes a run: tools that clear their environment, double-fork or
background themselves are gone after a stop, a timeout, a normal end, and
after the process running the run is killed with SIGKILL.

The escaping processes carry no marker, so these tests follow them by pid
(the fake claude writes them to files) and wait on pidfds, never on a scan.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import RunRequest, ToolResult, run_claude
from runner.cgroups import probe
from runner.process import wait_exited
from runner.proctree import own_cgroup
from tests.fakes.fake_claude import FAKE_CLAUDE
from tests.runner.conftest import Recorder, is_alive
from tests.runner.test_run_fake import fake_env, make_request, record

pytestmark = pytest.mark.slow

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


@pytest.mark.parametrize("cgroup_parent", CGROUP_PARENTS)
async def test_escaping_tools_are_stopped_with_the_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder, cgroup_parent: str
) -> None:
    task = asyncio.create_task(
        run_claude(escaping_request(run_id, tmp_path, cgroup_parent, sleep="300"), recorder)
    )
    await recorder.wait_for(ToolResult)  # the escapes started before the first line
    pids = escaped(tmp_path)
    assert alive(pids) == pids
    # None of them can be found by the environment marker.
    for pid in pids:
        assert b"CHATBRIDGE_RUN_MARKER" not in Path(f"/proc/{pid}/environ").read_bytes()

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert alive([record(tmp_path)["pid"], *pids]) == []


@pytest.mark.parametrize("cgroup_parent", CGROUP_PARENTS)
async def test_escaping_tools_are_stopped_at_the_time_limit(
    run_id: RunId, tmp_path: Path, recorder: Recorder, cgroup_parent: str
) -> None:
    request = escaping_request(run_id, tmp_path, cgroup_parent, sleep="300")
    report = await run_claude(RunRequest(**{**request.__dict__, "run_timeout_s": 3.0}), recorder)
    assert report.status is RunStatus.TIMED_OUT
    assert alive([record(tmp_path)["pid"], *escaped(tmp_path)]) == []


@pytest.mark.parametrize("cgroup_parent", CGROUP_PARENTS)
async def test_escaping_tools_end_with_a_normal_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder, cgroup_parent: str
) -> None:
    # claude prints its result and exits 0, leaving its tools running.
    report = await run_claude(escaping_request(run_id, tmp_path, cgroup_parent), recorder)
    assert report.status is RunStatus.SUCCEEDED
    assert report.exit_code == 0
    assert alive(escaped(tmp_path)) == []


async def test_orphans_are_reaped_during_the_run(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # The double fork's middle process exits at once: an orphan that re-parents
    # to the supervisor and must not stay a zombie while the run goes on.
    task = asyncio.create_task(
        run_claude(escaping_request(run_id, tmp_path, sleep="300"), recorder)
    )
    try:
        await recorder.wait_for(ToolResult)
        supervisor = ppid(record(tmp_path)["pid"])
        # The re-parented orphans are the supervisor's children now.
        assert ppid(escaped(tmp_path)[1]) == supervisor

        def zombies() -> list[int]:
            found = []
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        state, parent = (
                            entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[:2]
                        )
                    except OSError:
                        continue
                    if parent == str(supervisor) and state == "Z":
                        found.append(int(entry.name))
            return found

        # Reaping follows SIGCHLD asynchronously: poll the other process's state.
        async with asyncio.timeout(10):
            while zombies():
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


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


async def test_kill_9_of_the_bridge_leaves_the_run_to_its_orphan_timeout(
    run_id: RunId, tmp_path: Path
) -> None:
    request = escaping_request(run_id, tmp_path, sleep="300", ignore_term="1")
    request = RunRequest(**{**request.__dict__, "orphan_timeout_s": 3.0})
    bridge, pids = await run_in_child_bridge(request, tmp_path)
    assert alive(pids) == pids

    bridge.send_signal(signal.SIGKILL)
    await bridge.wait()
    # The run is detached from the bridge: it goes on (a restarted bridge would
    # attach again) ...
    assert alive(pids) == pids
    # ... until no bridge came for the orphan timeout: then the supervisor stops
    # it by itself (claude ignores SIGTERM here: the grace period and SIGKILL).
    await until_exited(pids)
    assert alive(pids) == []


@needs_cgroups
async def test_a_tool_that_left_the_runs_cgroup_still_gets_the_stop_signal(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    """Root can move a process out of the run's group: the supervisor's SIGTERM
    reaches it all the same (it is still a descendant), not only the kill phase."""
    told, started = tmp_path / "told", tmp_path / "started"
    os.mkfifo(started)
    tool = (
        f"echo $$ > {own_cgroup()}/cgroup.procs; "
        f'trap "echo TERM > {told}; exit 0" TERM; echo $$ > {started}; '
        "while :; do sleep 0.05; done"
    )
    wrapper = tmp_path / "claude-with-tool"
    wrapper.write_text(
        f"#!/bin/sh\nsh -c '{tool}' </dev/null >/dev/null 2>&1 &\n"
        f'exec "{sys.executable}" "{FAKE_CLAUDE}" "$@"\n'
    )
    wrapper.chmod(0o755)
    request = make_request(
        run_id,
        tmp_path,
        claude_bin=str(wrapper),
        env=fake_env(tmp_path, sleep="300"),
        stop_grace_s=30.0,  # far longer than the test: only the SIGTERM can end the tool in time
        cgroup_parent="auto",
    )
    task = asyncio.create_task(run_claude(request, recorder))
    # The FIFO's open blocks until the tool has left the group and writes its pid.
    pid = int(await asyncio.to_thread(started.read_text))
    assert run_id not in Path(f"/proc/{pid}/cgroup").read_text()  # out of the run's group
    await recorder.wait_for(ToolResult)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert told.read_text().strip() == "TERM"
    assert alive([pid]) == []

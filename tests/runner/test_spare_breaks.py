"""Adversarial review of the spare supervisors (runner/spare.py): a spare frozen
while it waits, orders bigger than a pipe, the bridge's death, a missing cwd,
recovery's view of a supervisor that was a spare.

Real processes: the supervisor started as a spare, the fake claude under it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import Init, Spares, Spawned, build_env, run_claude, supervision
from runner.recovery import _find_supervisor
from runner.spare import Spare, start_spare
from runner.supervision import RunLimits, supervisor_options
from tests.runner.conftest import Recorder, exit_of, is_alive
from tests.runner.fake_runs import assert_nothing_left, fake_env, make_request

pytestmark = pytest.mark.slow

BIG = 100 * 1024
"""Bigger than a pipe's buffer (64 KiB), below one argument's limit (128 KiB)."""


@pytest.fixture
def frozen() -> Iterator[list[int]]:
    """Pids the test stops (SIGSTOP); continued and killed at teardown whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break


def ready_spare(spares: Spares) -> Spare:
    spares.refill()
    spare = spares._ready
    assert spare is not None
    return spare


async def wait_stopped(pid: int) -> None:
    """Until ``pid`` shows as stopped in /proc (a SIGSTOP is delivered asynchronously)."""
    async with asyncio.timeout(10):
        while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
            await asyncio.sleep(0.001)


class LoopWatch:
    """The longest the event loop went without running a callback (a blocking call on it)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._since = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = self._since
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    def __enter__(self) -> LoopWatch:
        self._since = time.monotonic()  # a block before the first tick counts too
        self._task = asyncio.create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def test_big_orders_to_a_frozen_spare_do_not_block_the_bridge(
    run_id: RunId, tmp_path: Path, frozen: list[int]
) -> None:
    """Orders bigger than the pipe (a long system prompt, a big environment) to a spare
    frozen (SIGSTOP) right as it is taken: the write must not block the event loop (every
    room) until someone continues the spare."""
    spare = start_spare()
    frozen.append(spare.proc.pid)
    os.kill(spare.proc.pid, signal.SIGSTOP)
    await wait_stopped(spare.proc.pid)
    # Safety net for the defect: without it a blocked loop would hang the test for ever.
    thaw = threading.Timer(5.0, os.kill, (spare.proc.pid, signal.SIGCONT))
    thaw.start()
    request = make_request(run_id, tmp_path)
    argv = ["claude", "--append-system-prompt", "x" * BIG]
    options = supervisor_options(request, argv, run_dir=tmp_path, limits=RunLimits())
    began = time.monotonic()
    try:
        taken = spare.send(options, {"PATH": "/usr/bin"})
    finally:
        thaw.cancel()
    took = time.monotonic() - began

    assert took < 1.0, f"the orders' write blocked the event loop for {took:.1f} s"
    # Either the orders lie whole in its pipe (a frozen spare then goes the way of a
    # frozen supervisor: WELCOME_S), or it was let go, killed and reaped.
    assert taken or spare.proc.returncode is not None
    if taken:
        spare.proc.kill()
        spare.proc.wait()
        spare.conn.close()


async def test_big_orders_to_a_frozen_spare_leave_the_run_to_a_supervisor_of_its_own(
    run_id: RunId, tmp_path: Path, recorder: Recorder, frozen: list[int]
) -> None:
    spares = Spares()
    spare = ready_spare(spares)
    frozen.append(spare.proc.pid)
    os.kill(spare.proc.pid, signal.SIGSTOP)
    await wait_stopped(spare.proc.pid)
    thaw = threading.Timer(5.0, os.kill, (spare.proc.pid, signal.SIGCONT))
    thaw.start()
    request = make_request(run_id, tmp_path, env=fake_env(tmp_path), append_system_prompt="x" * BIG)
    try:
        with LoopWatch() as watch:
            report = await run_claude(request, recorder, spares=spares)
    finally:
        thaw.cancel()
        await spares.close()

    assert report.status is RunStatus.SUCCEEDED
    assert watch.longest < 1.0, f"the event loop was blocked for {watch.longest:.1f} s"
    assert recorder.of(Spawned)[0].live.supervisor_pid != spare.proc.pid
    assert_nothing_left(run_id, tmp_path)


async def test_big_orders_to_a_live_spare_still_reach_it(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    """The spare path for big orders works (the supervisor is the spare, claude gets them)."""
    spares = Spares()
    spare = ready_spare(spares)
    big = "y" * BIG
    request = make_request(
        run_id,
        tmp_path,
        env=fake_env(tmp_path, echo="1") | {"BIG": big},
        append_system_prompt=big,
    )
    try:
        report = await run_claude(request, recorder, spares=spares)
    finally:
        await spares.close()

    assert report.status is RunStatus.SUCCEEDED
    assert recorder.of(Spawned)[0].live.supervisor_pid == spare.proc.pid
    assert_nothing_left(run_id, tmp_path)


async def test_a_spare_frozen_while_it_waited_is_not_given_the_run(
    run_id: RunId,
    tmp_path: Path,
    recorder: Recorder,
    frozen: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A spare stopped (SIGSTOP) while it waited: the run must not be handed to it
    (it would fail after WELCOME_S as "unanswered"); it starts its own supervisor."""
    monkeypatch.setattr(supervision, "WELCOME_S", 1.0)  # the defect then costs 1 s, not 10
    spares = Spares()
    spare = ready_spare(spares)
    frozen.append(spare.proc.pid)
    os.kill(spare.proc.pid, signal.SIGSTOP)
    await wait_stopped(spare.proc.pid)
    request = make_request(run_id, tmp_path, env=fake_env(tmp_path))
    try:
        report = await run_claude(request, recorder, spares=spares)
    finally:
        await spares.close()

    assert report.status is RunStatus.SUCCEEDED, report.error
    assert recorder.of(Spawned)[0].live.supervisor_pid != spare.proc.pid
    assert not is_alive(spare.proc.pid)  # not left frozen behind
    assert_nothing_left(run_id, tmp_path)


async def test_recovery_knows_the_grace_of_a_supervisor_that_was_a_spare(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    spares = Spares()
    spare = ready_spare(spares)
    request = make_request(run_id, tmp_path, env=fake_env(tmp_path, sleep="60"), stop_grace_s=2.0)
    task = asyncio.create_task(run_claude(request, recorder, spares=spares))
    try:
        await recorder.wait_for(Spawned)
        found = await _find_supervisor(run_id)
        assert found is not None
        os.close(found.fd)
        assert found.pid == spare.proc.pid
        # Recovery waits this long (plus the kill phase) before killing the tree. Its
        # command line does not say: 30 s instead of 2 s delayed a restart; below a
        # longer configured grace it killed the run in the middle of its stop.
        assert found.grace_s == request.stop_grace_s
    finally:
        task.cancel()
        report = await asyncio.gather(task, return_exceptions=True)
        await spares.close()
    assert report
    assert_nothing_left(run_id)


async def test_a_spare_given_a_run_whose_cwd_is_missing_reports_it(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    spares = Spares()
    spare = ready_spare(spares)
    missing = tmp_path / "gone"
    request = make_request(run_id, tmp_path, env=fake_env(tmp_path), cwd=missing)
    try:
        report = await run_claude(request, recorder, spares=spares)
    finally:
        await spares.close()

    assert report.status is RunStatus.FAILED
    assert str(missing) in report.error
    assert not is_alive(spare.proc.pid)
    assert_nothing_left(run_id)


BRIDGE = """
import asyncio, os, sys
sys.path.insert(0, sys.argv[1])
from runner import Spares

async def main():
    spares = Spares()
    spares.refill()
    print(spares._ready.proc.pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_bridge_killed_with_a_spare_waiting_leaves_no_spare() -> None:
    root = str(Path(__file__).resolve().parents[2])
    bridge = subprocess.Popen(
        [sys.executable, "-c", BRIDGE, root], stdout=subprocess.PIPE, env=dict(os.environ)
    )
    try:
        assert bridge.stdout is not None
        line = await asyncio.to_thread(bridge.stdout.readline)
        spare_pid = int(line)
        pidfd = os.pidfd_open(spare_pid)
    finally:
        bridge.kill()
        bridge.wait()
        if bridge.stdout is not None:
            bridge.stdout.close()
    try:
        await exit_of(pidfd)
    finally:
        os.close(pidfd)
    assert not is_alive(spare_pid)


@pytest.mark.parametrize(
    ("env", "argv_extra"),
    [({"X": "a\0b"}, ""), ({}, "a\0b"), ({"A=B": "c"}, "")],
    ids=["NUL in a value", "NUL in an argument", "= in a name"],
)
async def test_an_environment_exec_refuses_is_reported_the_same_with_a_spare(
    tmp_path: Path, recorder: Recorder, env: dict[str, str], argv_extra: str
) -> None:
    """exec refuses a NUL in claude's argv or environment (a room's ``env``, its system
    prompt): the run fails saying so, as without a spare (not "Exec format error",
    which points at the claude binary); the spare is not spent on it."""
    errors: list[str] = []
    spares = Spares()
    spare = ready_spare(spares)
    try:
        for with_spares in (None, spares):
            run_id = RunId(f"test-nul-{len(errors)}-{os.getpid()}")
            request = make_request(
                run_id,
                tmp_path,
                env=fake_env(tmp_path) | env,
                append_system_prompt=argv_extra,
            )
            report = await run_claude(request, recorder, spares=with_spares)
            assert report.status is RunStatus.FAILED
            errors.append(report.error)
            assert_nothing_left(run_id)
        assert spares._ready is spare
        assert spare.alive()
    finally:
        await spares.close()
    assert "Exec format error" not in errors[1]
    assert errors[1] == errors[0]


async def test_two_runs_at_once_share_one_spare(tmp_path: Path) -> None:
    spares = Spares()
    spare = ready_spare(spares)
    runs = []
    for name in ("a", "b"):
        cwd = tmp_path / name
        cwd.mkdir()
        run_id = RunId(f"test-two-{name}-{os.getpid()}")
        runs.append((run_id, cwd, make_request(run_id, cwd, env=fake_env(cwd)), Recorder()))
    try:
        reports = await asyncio.gather(
            *(run_claude(request, recorder, spares=spares) for _, _, request, recorder in runs)
        )
    finally:
        await spares.close()

    assert [r.status for r in reports] == [RunStatus.SUCCEEDED] * 2
    supervisors = [recorder.of(Spawned)[0].live.supervisor_pid for *_, recorder in runs]
    assert spare.proc.pid in supervisors
    assert len(set(supervisors)) == 2
    for run_id, cwd, _, _ in runs:
        assert_nothing_left(run_id, cwd)


async def test_claude_under_a_spare_gets_exactly_the_runs_environment(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    """Nothing of the spare's own (Python's locale coercion, say) nor less than build_env."""
    spares = Spares()
    ready_spare(spares)
    request = make_request(run_id, tmp_path, env=fake_env(tmp_path, sleep="60"))
    task = asyncio.create_task(run_claude(request, recorder, spares=spares))
    try:
        # Once claude speaks: its launcher (a shell script) has exec'd its Python, whose
        # environment is read (in between, an exec's environment may read empty).
        await recorder.wait_for(Init)
        claude = recorder.of(Spawned)[0].pid
        environ = Path(f"/proc/{claude}/environ").read_bytes().split(b"\0")
        got = dict(e.decode().partition("=")[::2] for e in environ if e)
        expected = build_env(request, os.environ)
        # The fake claude is a shell script: the shell sets PWD to where it runs.
        assert got.pop("PWD") == str(tmp_path)
        expected.pop("PWD", None)
        assert got == expected
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await spares.close()
    assert_nothing_left(run_id)


@pytest.mark.parametrize("how", ["timeout", "stop", "supervisor killed"])
async def test_a_spare_born_run_ended_early_leaves_nothing(
    run_id: RunId, tmp_path: Path, recorder: Recorder, how: str
) -> None:
    spares = Spares()
    spare = ready_spare(spares)
    request = make_request(
        run_id,
        tmp_path,
        env=fake_env(tmp_path, sleep="60"),
        run_timeout_s=1 if how == "timeout" else 60,
    )
    task = asyncio.create_task(run_claude(request, recorder, spares=spares))
    try:
        await recorder.wait_for(Spawned)
        assert recorder.of(Spawned)[0].live.supervisor_pid == spare.proc.pid
        if how == "stop":
            task.cancel()
        elif how == "supervisor killed":
            os.kill(spare.proc.pid, signal.SIGKILL)
        reports = await asyncio.gather(task, return_exceptions=True)
    finally:
        await spares.close()

    if how == "timeout":
        assert reports[0].status is RunStatus.TIMED_OUT  # type: ignore[union-attr]
    elif how == "stop":
        assert isinstance(reports[0], asyncio.CancelledError)
    else:
        assert reports[0].status is not RunStatus.SUCCEEDED  # type: ignore[union-attr]
    assert not is_alive(spare.proc.pid)
    assert not is_alive(recorder.of(Spawned)[0].pid)  # claude
    assert_nothing_left(run_id)

"""Prestart with the real claude: used by the run, or cancelled leaving nothing."""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import Result, Spawned, run_claude
from runner.prestart import prestart
from tests.fakes.model_server import ModelServer, Turn, claude_bin, claude_env
from tests.runner.conftest import Recorder, is_alive, pids_with_marker
from tests.runner.real_claude import chatbridge_console, real_request

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]


async def test_a_prestarted_claude_takes_the_prompt(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    async with ModelServer([Turn(text="Warm answer.")]) as server:
        request = real_request(run_id, tmp_path, server, "hello")
        started = await prestart(replace(request, prompt=""))
        assert await started.ready
        assert started.matches(request)
        assert server.agent_requests == []  # claude idles until the prompt
        report = await run_claude(request, recorder, prestarted=started)
        texts = "\n".join(server.agent_requests[-1].texts())
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "Warm answer."
    assert "hello" in texts
    (spawned,) = recorder.of(Spawned)
    assert spawned.pid == started.live.claude_pid
    assert len(recorder.of(Result)) == 1
    assert pids_with_marker(run_id) == []
    assert not Path(started.run_dir).exists()
    await started.cancel()  # after a run took it: nothing to do


async def test_a_cancelled_prestart_leaves_nothing(run_id: RunId, tmp_path: Path) -> None:
    async with ModelServer([]) as server:
        request = real_request(run_id, tmp_path, server, "", state_dir=tmp_path / "state")
        started = await prestart(request)
        assert await started.ready
        assert is_alive(started.live.claude_pid)
        await started.cancel()
        assert server.agent_requests == []
    assert pids_with_marker(run_id) == []
    assert not is_alive(started.live.supervisor_pid)
    assert not Path(started.run_dir).exists()
    assert list((tmp_path / "state" / "runs").iterdir()) == []


async def test_a_prestart_that_does_not_match_gives_way_to_a_cold_start(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    async with ModelServer([Turn(text="Cold answer.")]) as server:
        request = real_request(run_id, tmp_path, server, "hello")
        started = await prestart(replace(request, prompt="", model="claude-opus-4-1"))
        assert not started.matches(request)
        report = await run_claude(request, recorder, prestarted=started)
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "Cold answer."
    (spawned,) = recorder.of(Spawned)
    assert spawned.pid != started.live.claude_pid
    assert not is_alive(started.live.claude_pid)
    assert pids_with_marker(run_id) == []


async def test_prestart_is_on_by_default_and_the_run_takes_the_prestarted_real_claude(
    tmp_path: Path,
) -> None:
    """The whole path: ``chatbridge run`` (console) with no prestart setting, the real claude."""
    from tests.bridge.harness import write_config

    async with ModelServer([Turn(text="Warm answer.")]) as server:
        env = claude_env(server.url, tmp_path / "home")
        config = write_config(
            tmp_path,
            {"runner": {"claude_bin": str(claude_bin())}, "dispatcher": {"coalesce_ms": 1500}},
            env=env,
        )
        assert "prestart" not in tomllib.loads(config.read_text())["runner"]
        returncode, out, log = await chatbridge_console(config, b"hello\n")
    assert returncode == 0, log
    assert "Warm answer." in out
    assert len(re.findall(r"prestart \S+ used", log)) == 1, log
    assert "given up" not in log

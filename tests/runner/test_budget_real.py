"""The real claude and ``--max-budget-usd``: the flag as the runner writes it is taken, and
a run over it ends as the runner reports it (scripted model server, offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import Result, run_claude
from tests.fakes.model_server import ModelServer, ToolCall, Turn, claude_bin
from tests.runner.conftest import Recorder
from tests.runner.real_claude import real_request

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]


async def test_a_generous_cap_changes_nothing(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    async with ModelServer([Turn(text="fine")]) as server:
        request = real_request(run_id, tmp_path, server, "hi", max_budget_usd=5.0)
        report = await run_claude(request, recorder)
    assert report.status is RunStatus.SUCCEEDED, report.error
    assert report.result_text == "fine"


async def test_a_run_past_its_cap_ends_with_error_max_budget_usd(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # The first model call already costs more than a millionth of a dollar; claude
    # checks after it, so the tool it asked for never runs.
    turns = [Turn(tools=(ToolCall("Bash", {"command": "touch ran"}),)), Turn(text="done")]
    async with ModelServer(turns) as server:
        request = real_request(run_id, tmp_path, server, "hi", max_budget_usd=1e-6)
        report = await run_claude(request, recorder)
    [result] = recorder.of(Result)
    assert result.subtype == "error_max_budget_usd"
    assert report.status is RunStatus.FAILED
    assert report.error.startswith("it reached its spending cap of $0.0000010 (max_budget_usd)")
    assert report.cost_usd is not None
    assert report.cost_usd > 1e-6

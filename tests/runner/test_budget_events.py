"""What claude says about money and limits: a run's budget cap and a usage limit, as the
runner decodes and reports them (the fake claude prints what the real one does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import Result, RunControl, UsageLimited, run_claude
from runner.stream import parse_line
from tests.runner.conftest import Recorder
from tests.runner.fake_runs import fake_env, make_request
from tests.runner.live_helpers import sending_at_the_first_result

# As claude 2.1.332 printed it (tests/fakes/fake_claude.py, FAKE_CLAUDE_USAGE_LIMIT).
REJECTED = {
    "type": "rate_limit_event",
    "rate_limit_info": {
        "status": "rejected",
        "resetsAt": 1795715804,
        "rateLimitType": "five_hour",
        "isUsingOverage": False,
        "unifiedWindows": {
            "five_hour": {"utilization": 1, "resetsAt": 1795715804, "status": "rejected"}
        },
    },
    "uuid": "1ee78d49-ed82-48c9-b760-fa59a3ccd72a",
    "session_id": "7855f4ed-e819-41ba-acd5-e3321d2a8edd",
}


def test_a_rejected_rate_limit_event_is_a_usage_limit_with_its_reset() -> None:
    line = json.dumps(REJECTED).encode()
    assert parse_line(line) == [UsageLimited(1795715804.0, "five_hour")]


@pytest.mark.parametrize(
    "info",
    [
        {"status": "allowed", "resetsAt": 1795715804},
        {"status": "allowed_warning", "resetsAt": 1795715804, "utilization": 0.9},
        "junk",
        None,
    ],
)
def test_other_rate_limit_events_change_nothing(info: object) -> None:
    line = json.dumps({**REJECTED, "rate_limit_info": info}).encode()
    assert parse_line(line) == []


def test_a_rejection_without_a_reset_time_says_so() -> None:
    info = {"status": "rejected", "resetsAt": None, "rateLimitType": "seven_day"}
    line = json.dumps({**REJECTED, "rate_limit_info": info}).encode()
    assert parse_line(line) == [UsageLimited(None, "seven_day")]


@pytest.mark.slow
async def test_a_run_at_its_budget_cap_fails_saying_so(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    env = fake_env(tmp_path, cost="0.75")
    report = await run_claude(make_request(run_id, tmp_path, env=env, max_budget_usd=0.5), recorder)
    assert report.status is RunStatus.FAILED
    assert report.cost_usd == 0.75
    assert report.error == (
        "it reached its spending cap of $0.50 (max_budget_usd) after spending $0.75."
    )
    assert "--max-budget-usd" in json.loads((tmp_path / "record.json").read_text())["argv"]
    [result] = recorder.of(Result)
    assert result.subtype == "error_max_budget_usd"


@pytest.mark.slow
async def test_a_cap_under_a_cent_is_told_in_dollars_and_cents(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # Not "$1e-06", nor "after spending $0.00" past a cap: the room reads both.
    env = fake_env(tmp_path, cost="0.000032")
    request = make_request(run_id, tmp_path, env=env, max_budget_usd=1e-6)
    report = await run_claude(request, recorder)
    assert report.error == (
        "it reached its spending cap of $0.0000010 (max_budget_usd) after spending $0.000032."
    )


@pytest.mark.slow
async def test_a_usage_limit_ends_the_run_with_its_reset_time(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    env = fake_env(tmp_path, usage_limit="3600")
    report = await run_claude(make_request(run_id, tmp_path, env=env), recorder)
    assert report.status is RunStatus.FAILED
    assert report.exit_code == 1
    [limited] = recorder.of(UsageLimited)
    assert limited.limit == "five_hour"
    assert limited.resets_at is not None
    assert "You've hit your 5-hour limit" in report.error


RESULT = {"type": "result", "subtype": "success", "is_error": False, "result": "ok"}


@pytest.mark.parametrize("cost", ["NaN", "Infinity", "-Infinity", "-0.5", "1e400"])
def test_a_cost_that_is_no_amount_is_not_reported(cost: str) -> None:
    # A misbehaving claude: a negative cost would lower the day's spend (and a
    # Prometheus counter refuses it), NaN or infinity would poison every sum after it.
    line = json.dumps(RESULT)[:-1] + f', "total_cost_usd": {cost}}}'
    [result] = parse_line(line.encode())
    assert isinstance(result, Result)
    assert result.cost_usd is None


def test_a_real_cost_is_reported() -> None:
    [result] = parse_line(json.dumps({**RESULT, "total_cost_usd": 0.0}).encode())
    assert isinstance(result, Result)
    assert result.cost_usd == 0.0


@pytest.mark.parametrize("resets_at", ["NaN", "Infinity", "1795715804000", "1e300"])
def test_a_reset_time_that_is_no_date_is_unknown(resets_at: str) -> None:
    # In milliseconds, say: no date a room can be told (datetime stops at year 9999).
    info = f'{{"status": "rejected", "rateLimitType": "five_hour", "resetsAt": {resets_at}}}'
    line = f'{{"type": "rate_limit_event", "rate_limit_info": {info}}}'
    assert parse_line(line.encode()) == [UsageLimited(None, "five_hour")]


@pytest.mark.slow
async def test_a_steered_runs_cost_is_the_whole_runs(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    # As the real claude (2.1.332, scripted model server): each result's
    # total_cost_usd is the process's so far (0.0006, then 0.0012 for a second
    # turn), so the run's last result carries what the run cost, steered turns too.
    control = RunControl()
    on_event, _ = sending_at_the_first_result(recorder, control, "and one more thing")
    env = fake_env(tmp_path, cost="0.25")
    report = await run_claude(make_request(run_id, tmp_path, env=env), on_event, control=control)
    assert [r.cost_usd for r in recorder.of(Result)] == [0.25, 0.5]
    assert report.cost_usd == 0.5

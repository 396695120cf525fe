"""The budget keys: ``[defaults] max_budget_usd`` / ``daily_budget_usd``, ``[budget] daily_usd``,
``[runner] resume_after_limit``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import load_settings
from bridge.core.model import RoomId, RoomKey, RunId, TransportName
from bridge.errors import ConfigError
from bridge.runs.request import run_request
from runner import build_argv
from tests.bridge.config_text import clean_env, write  # noqa: F401 (clean_env: an autouse fixture)

CONSOLE = RoomKey(TransportName("console"), RoomId("console"))


def test_budgets_are_off_by_default(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, ""))
    assert settings.budget.daily_usd is None
    assert not settings.runner.resume_after_limit
    room = settings.room(CONSOLE)
    assert room is not None
    assert (room.max_budget_usd, room.daily_budget_usd) == (None, None)
    request = run_request(settings, room, RunId("run-1"), "hi", None)
    assert "--max-budget-usd" not in build_argv(request)


def test_rooms_inherit_and_override_budgets_and_runs_get_the_cap(tmp_path: Path) -> None:
    settings = load_settings(
        write(
            tmp_path,
            """
[defaults]
max_budget_usd = 0.5
daily_budget_usd = 5

[budget]
daily_usd = 20

[runner]
resume_after_limit = true

[[rooms]]
transport = "console"
id = "console"
max_budget_usd = 1.25
""",
        )
    )
    room = settings.room(CONSOLE)
    assert room is not None
    assert (room.max_budget_usd, room.daily_budget_usd) == (1.25, 5.0)
    assert settings.defaults.max_budget_usd == 0.5
    assert settings.budget.daily_usd == 20.0
    assert settings.runner.resume_after_limit
    argv = build_argv(run_request(settings, room, RunId("run-1"), "hi", None))
    assert argv[argv.index("--max-budget-usd") + 1] == "1.25"


def test_budgets_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATBRIDGE_BUDGET__DAILY_USD", "7.5")
    monkeypatch.setenv("CHATBRIDGE_DEFAULTS__DAILY_BUDGET_USD", "2")
    settings = load_settings(None)
    assert (settings.budget.daily_usd, settings.defaults.daily_budget_usd) == (7.5, 2.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[defaults]\nmax_budget_usd = 0\n", "defaults.max_budget_usd"),
        ("[defaults]\nmax_budget_usd = -1\n", "defaults.max_budget_usd"),
        ("[defaults]\nmax_budget_usd = 'lots'\n", "defaults.max_budget_usd"),
        ("[defaults]\ndaily_budget_usd = nan\n", "defaults.daily_budget_usd"),
        ("[defaults]\ndaily_budget_usd = inf\n", "defaults.daily_budget_usd"),
        ("[budget]\ndaily_usd = 0\n", "budget.daily_usd"),
        ("[budget]\nmonthly_usd = 3\n", "budget.monthly_usd"),
        ("[runner]\nresume_after_limit = 'sometimes'\n", "runner.resume_after_limit"),
        (
            "[[rooms]]\ntransport = 'console'\nid = 'console'\ndaily_budget_usd = -2\n",
            "rooms[0].daily_budget_usd",
        ),
    ],
)
def test_bad_budgets_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    assert expected in str(info.value)
    if "= 0\n" in text or "-" in text:
        assert "greater than 0" in str(info.value)


@pytest.mark.parametrize(
    "budget",
    [
        "[budget]\ndaily_usd = 5\n",
        "[defaults]\ndaily_budget_usd = 5\n",
        "[[rooms]]\ntransport = 'console'\nid = 'console'\ndaily_budget_usd = 5\n",
    ],
)
def test_a_daily_budget_needs_a_ledger_that_keeps_a_day(tmp_path: Path, budget: str) -> None:
    # Pruned after half a day, the ledger would forget this morning's runs by the
    # evening: the day's spending would read too low and the budget let runs start.
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, f"[database]\nretention_days = 0.5\n{budget}"))
    assert "database.retention_days" in str(info.value)
    assert "at least 1" in str(info.value)
    # Without a daily budget, half a day is fine; with one, a day is.
    load_settings(write(tmp_path, "[database]\nretention_days = 0.5\n"))
    load_settings(write(tmp_path, f"[database]\nretention_days = 1\n{budget}"))

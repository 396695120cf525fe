"""Run requests for the fake claude, its environment, and checks that a run left nothing behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bridge.core.model import RunId
from runner import RunRequest
from tests.fakes.fake_claude import install
from tests.runner.conftest import is_alive, pids_with_marker


def make_request(run_id: RunId, tmp_path: Path, prompt: str = "hi", **overrides: Any) -> RunRequest:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "claude_bin": str(install(tmp_path)),
        "cwd": tmp_path,
        "prompt": prompt,
        "session_id": None,
        "run_timeout_s": 60,
        "idle_timeout_s": 60,
        "stop_grace_s": 2.0,
    }
    fields.update(overrides)
    return RunRequest(**fields)


def fake_env(tmp_path: Path, **switches: str) -> dict[str, str]:
    env = {"FAKE_CLAUDE_RECORD": str(tmp_path / "record.json")}
    env.update({f"FAKE_CLAUDE_{k.upper()}": v for k, v in switches.items()})
    return env


def record(tmp_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / "record.json").read_text())
    return data


def assert_nothing_left(run_id: RunId, tmp_path: Path | None = None) -> None:
    assert pids_with_marker(run_id) == []
    if tmp_path is not None:
        rec = record(tmp_path)
        assert [p for p in [rec["pid"], *rec["children"]] if is_alive(p)] == []

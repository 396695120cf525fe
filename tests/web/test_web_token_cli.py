"""``chatbridge web-token`` (bridge/cli.py, docs/web.md "Signing in")."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.cli import main
from tests.bridge.harness import write_config

WEB = {
    "http": {"listen": "127.0.0.1:0"},
    "web": {"enabled": True, "identities": {"alice": ["U1"]}},
}


@pytest.mark.parametrize("hours", ["nan", "inf", "-1", "0"])
def test_a_lifetime_that_is_no_number_of_hours_is_refused(
    tmp_path: Path, hours: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, WEB)
    assert main(["web-token", "alice", "--config", str(path), "--hours", hours]) == 2
    assert "--hours must be" in capsys.readouterr().err


def test_a_token_is_printed_for_a_known_identity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, WEB)
    assert main(["web-token", "alice", "--config", str(path), "--hours", "1"]) == 0
    assert "/web/login?token=login." in capsys.readouterr().out

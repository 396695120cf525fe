"""``chatbridge run`` against the real Synapse when the bot cannot log in: one line, exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.transports.matrix.matrix_service import config_toml
from tests.transports.matrix.synapse_peer import MatrixUser, SynapseServer

pytestmark = pytest.mark.slow


def test_refused_password_is_one_line_and_exit_1(
    synapse: SynapseServer, bot: MatrixUser, tmp_path: Path
) -> None:
    config = tmp_path / "chatbridge.toml"
    config.write_text(
        config_toml(
            tmp_path,
            synapse=synapse,
            bot=bot,
            room_id="!nowhere:localhost",
            allowed=(),
            matrix_extra={},
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBRIDGE_")}
    env["CHATBRIDGE_MATRIX__PASSWORD"] = "not-the-password"
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "run", "--config", str(config)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "chatbridge ready" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert "matrix" in errors[0]
    assert "not-the-password" not in result.stderr

"""For tests of the configuration as an operator writes it: TOML text, and an
environment without the ``CHATBRIDGE_*`` variables of the machine running them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def write(tmp_path: Path, text: str) -> Path:
    """``text`` as the configuration file ``chatbridge.toml`` under ``tmp_path``."""
    path = tmp_path / "chatbridge.toml"
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``CHATBRIDGE_*`` variable of the shell reaches the settings under test."""
    for name in list(os.environ):
        if name.startswith("CHATBRIDGE_"):
            monkeypatch.delenv(name)

"""The state directory's lock and checks at start-up (bridge/host/state_lock.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bridge.errors import StartupError
from bridge.host.state_lock import state_dir_lock


def test_a_lax_state_dir_is_made_private_and_a_symlink_to_it_is_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    real.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(real)  # an operator placing the state elsewhere
    with state_dir_lock(link):
        assert (real / "lock").read_text() == f"{os.getpid()}\n"
    assert real.stat().st_mode & 0o777 == 0o700
    assert (real / "runs").stat().st_mode & 0o777 == 0o700


def test_the_lock_is_held_until_the_block_ends(tmp_path: Path) -> None:
    with (
        state_dir_lock(tmp_path / "state"),
        pytest.raises(StartupError, match="is in use by another chatbridge"),
        state_dir_lock(tmp_path / "state"),
    ):
        pass
    with state_dir_lock(tmp_path / "state"):
        pass


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory away")
def test_a_state_dir_of_another_user_is_refused_at_start_up(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)
    with (
        pytest.raises(StartupError, match=r"runner.state_dir: .* is owned by uid 65534"),
        state_dir_lock(theirs),
    ):
        pass


def test_a_planted_runs_symlink_is_refused_at_start_up(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir()
    (state / "runs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StartupError, match="is not a directory"), state_dir_lock(state):
        pass

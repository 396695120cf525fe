"""Session-wide test settings.

Each pytest session gets a base temp directory of its own (unless
``--basetemp`` names one) and removes it at the end: with pytest's default
base directory, two sessions on one machine would delete each other's
directories (retention is "none").
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

from tests.file_modes import umask  # noqa: F401 (fixtures for every test package)
from tests.small_disk import small_disk  # noqa: F401

_OWN_BASETEMP = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        path = tempfile.mkdtemp(prefix="chatbridge-tests-")
        config.option.basetemp = path
        config.stash[_OWN_BASETEMP] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_OWN_BASETEMP, None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _private_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every test's service keeps its runs' sockets and journals in a directory of its own.

    The default ``[runner] state_dir`` is relative to the working directory:
    two tests (or two sessions) sharing it would see each other's runs as
    strays to clean up. Set from the environment, it reaches services started
    as subprocesses too (those that strip ``CHATBRIDGE_*`` set it in their
    configuration file).
    """
    monkeypatch.setenv(
        "CHATBRIDGE_RUNNER__STATE_DIR", str(tmp_path_factory.mktemp("state", numbered=True))
    )

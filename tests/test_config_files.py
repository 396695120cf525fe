"""The test configuration helper: tables merge, values replace, TOML round-trips."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.config_files import merged, toml_text, write_toml


def test_tables_merge_and_other_values_replace() -> None:
    base = {"runner": {"a": 1, "b": 2}, "defaults": {"env": {"X": "1"}}, "rooms": [{"id": "r"}]}
    over = {"runner": {"b": 3}, "defaults": {"env": {"Y": "2"}}, "rooms": [{"id": "s"}]}
    assert merged(base, over) == {
        "runner": {"a": 1, "b": 3},
        "defaults": {"env": {"X": "1", "Y": "2"}},
        "rooms": [{"id": "s"}],
    }
    assert base["runner"] == {"a": 1, "b": 2}  # the base is not changed


def test_awkward_values_survive_the_round_trip(tmp_path: Path) -> None:
    odd = tmp_path / 'a "quoted" dir\\with\nnewline'
    data = {"defaults": {"cwd": odd, "env": {"K": 'it\'s "x"'}}, "rooms": [{"id": "!r:h"}]}
    path = write_toml(tmp_path / "c.toml", data)
    assert tomllib.loads(path.read_text()) == {
        "defaults": {"cwd": str(odd), "env": {"K": 'it\'s "x"'}},
        "rooms": [{"id": "!r:h"}],
    }
    assert toml_text(data) == path.read_text()

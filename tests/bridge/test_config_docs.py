"""The configuration reference cannot drift from the settings model."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from bridge.config import RoomConfig, RoomDefaults, Settings
from bridge.core.hostport import HostPort

DOC = Path(__file__).parents[2] / "docs" / "configuration.md"
ROW = re.compile(r"^\| `(?P<key>[a-z_]+)` \| (?P<default>[^|]+) \|")


def documented() -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            current = re.findall(r"`\[+([a-z]+)\]+`", line)[0]
            sections.setdefault(current, {})
        elif (match := ROW.match(line)) and current:
            sections[current][match["key"]] = match["default"].strip()
    return sections


def model_for(section: str) -> type[BaseModel]:
    if section == "defaults":
        return RoomDefaults
    annotation = Settings.model_fields[section].annotation
    for candidate in getattr(annotation, "__args__", (annotation,)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    raise AssertionError(section)


def plain(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Path | HostPort):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def test_every_section_is_documented() -> None:
    sections = set(documented())
    expected = {name for name in Settings.model_fields if name != "rooms"}
    assert sections == expected


@pytest.mark.parametrize("section", sorted(set(Settings.model_fields) - {"rooms"}))
def test_keys_and_defaults_match(section: str) -> None:
    model = model_for(section)
    rows = documented()[section]
    if section == "defaults":
        room_keys = set(RoomConfig.model_fields)
        assert set(rows) == set(model.model_fields) | room_keys
        rows = {k: v for k, v in rows.items() if k not in room_keys}
    assert set(rows) == set(model.model_fields)
    for key, text in rows.items():
        field = model.model_fields[key]
        if text == "(required)":
            assert field.is_required(), key
            continue
        default = field.get_default(call_default_factory=True)
        if text == "(unset)":  # TOML has no null: an optional key left out
            assert default is None, key
            continue
        doc_value = tomllib.loads(f"v = {text.strip('`')}")["v"]
        assert doc_value == plain(default), f"[{section}] {key}"

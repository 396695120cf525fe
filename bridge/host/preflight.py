"""What every run needs, checked once at start-up: the claude binary, each room's cwd.

Problems here are warnings, not start-up failures: a room's directory may be
mounted later and a binary installed while the bridge runs; but without a
warning the operator sees "chatbridge ready" and then only failed runs. Each
problem is one line naming the setting to fix. The binary is resolved as in
``chatbridge check-config`` (:func:`bridge.host.claude_check.check_binary`), with
the PATH each room's claude is spawned with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from bridge.config import Settings
from bridge.core.model import RoomKey
from bridge.host.claude_check import check_binary
from runner.command import OWN_SETTINGS_PREFIX


def run_problems(settings: Settings, env: Mapping[str, str]) -> list[str]:
    """One line per problem that would fail every run of some room; empty when none.

    ``env`` is the environment runs inherit (each room's ``env`` is laid over
    it). Runs ``claude --version`` once per distinct PATH: call it off the
    event loop.
    """
    return [*_binary_problems(settings, env), *_cwd_problems(settings)]


def _binary_problems(settings: Settings, env: Mapping[str, str]) -> list[str]:
    # Rooms whose claude is spawned with one PATH find the same binary. Like
    # the runner, the probe gets none of chatbridge's own settings (secrets).
    base = {k: v for k, v in env.items() if not k.startswith(OWN_SETTINGS_PREFIX)}
    by_path: dict[str | None, tuple[dict[str, str], list[RoomKey]]] = {}
    for key, room in settings.room_settings.items():
        room_env = {**base, **room.env}
        by_path.setdefault(room_env.get("PATH"), (room_env, []))[1].append(key)
    if not by_path:
        by_path[base.get("PATH")] = (base, [])
    problems = []
    for room_env, rooms in by_path.values():
        binary = check_binary(settings.runner.claude_bin, room_env)
        if binary.problem is None:
            continue
        where = "" if len(by_path) == 1 else f" (PATH of rooms {_names(rooms)})"
        problems.append(f"{binary.describe()}{where}: runs will fail")
    return problems


def _cwd_problems(settings: Settings) -> list[str]:
    # The setting a room's cwd comes from: its own [[rooms]] entry, or [defaults].
    setting_of: dict[RoomKey, str] = {
        entry.key: f"rooms[{index}].cwd"
        for index, entry in enumerate(settings.rooms)
        if "cwd" in entry.overrides
    }
    rooms_by_setting: dict[tuple[str, Path], list[RoomKey]] = {}
    for key, room in settings.room_settings.items():
        setting = setting_of.get(key, "defaults.cwd")
        rooms_by_setting.setdefault((setting, room.cwd), []).append(key)
    problems = []
    for (setting, cwd), rooms in rooms_by_setting.items():
        problem = _directory_problem(cwd)
        if problem is not None:
            problems.append(
                f"{setting} = {str(cwd)!r}: {problem}; runs in {_names(rooms)} will fail"
            )
    return problems


def _directory_problem(cwd: Path) -> str | None:
    """Why claude could not be started in ``cwd``; None if it can."""
    if not cwd.exists():
        return "does not exist"
    if not cwd.is_dir():
        return "is not a directory"
    if not os.access(cwd, os.X_OK):
        return "is not accessible to this user"
    return None


def _names(rooms: list[RoomKey]) -> str:
    return ", ".join(sorted(f"{key.transport}:{key.room_id}" for key in rooms)) or "no room"


__all__ = ["run_problems"]

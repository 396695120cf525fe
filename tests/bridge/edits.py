"""Tool inputs of claude's file edits."""

from __future__ import annotations

from pathlib import Path


def replace_all_edit(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """A config file with a line twice, and an Edit turning both with ``replace_all``."""
    conf = tmp_path / "app.conf"
    conf.write_text("name = x\ndebug = false\nport = 1\ndebug = false\n")
    edit = {
        "file_path": str(conf),
        "old_string": "debug = false",
        "new_string": "debug = true",
        "replace_all": True,
    }
    return conf, edit

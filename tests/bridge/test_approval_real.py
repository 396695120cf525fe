"""The real ``claude`` asks through the bridge; the console shows the request whole and
``!approve`` sends back the input shown, which the CLI then runs (docs/live-runs.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.config import load_settings
from tests.bridge.edits import replace_all_edit
from tests.bridge.harness import ConsoleSession
from tests.bridge.real_claude import real_claude_config
from tests.fakes.model_server import ModelServer, ToolCall, Turn, claude_bin

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]

WAIT_S = 120


async def shown_then_approved(tmp_path: Path, path: Path, edit: dict[str, object]) -> str:
    """Run the real claude on a Read of ``path`` then ``edit``; what the console showed of
    the Edit request, which is then approved (the CLI runs it) and the run ends."""
    initial = path.read_bytes()
    script = [
        # The CLI edits only a file it has read.
        Turn(tools=(ToolCall("Read", {"file_path": str(path)}),)),
        Turn(tools=(ToolCall("Edit", edit),)),
        Turn(text="Edited."),
    ]
    async with ModelServer(script) as server:
        config = real_claude_config(tmp_path, server, {"defaults": {"approve_tools": True}})
        async with asyncio.timeout(WAIT_S), ConsoleSession(load_settings(config)) as bridge:
            bridge.send("edit it")
            out = await bridge.wait_for("Unanswered, it is denied in")
            shown = out[out.index("Claude asks to use `Edit`") :]
            assert path.read_bytes() == initial  # nothing ran yet
            bridge.send("!approve")
            await bridge.wait_for("Edited.")
    return shown


async def test_an_edit_with_replace_all_is_shown_as_the_files_diff_and_runs_as_shown(
    tmp_path: Path,
) -> None:
    conf, edit = replace_all_edit(tmp_path)
    shown = await shown_then_approved(tmp_path, conf, edit)
    # What replace_all does to the file as it is: both lines change.
    assert shown.count("* -debug = false") == 2
    assert shown.count("* +debug = true") == 2
    assert "replace_all: `true`" in shown
    assert conf.read_text() == "name = x\ndebug = true\nport = 1\ndebug = true\n"


@pytest.mark.parametrize(
    ("before", "edit", "removed", "after"),
    [
        # An old_string replaced by nothing takes its line's newline: the line goes.
        ("one\ntwo\nthree\n", ("two", ""), "\n* -two\n*  three", "one\nthree\n"),
        # Straight quotes find the file's curly ones; the CLI edits that line.
        (
            "a\nsay \u2018hi\u2019\n",
            ("say 'hi'", "say 'bye'"),
            "\n* -say \u2018hi\u2019\n",
            "a\nsay \u2018bye\u2019\n",
        ),
        # A file of CRLF lines: the CLI matches "a\nb" and keeps the file's line ends.
        ("a\r\nb\r\nc\r\n", ("a\nb", "x\ny"), "\n* -a\n* -b\n* +x\n* +y\n", "x\r\ny\r\nc\r\n"),
    ],
)
async def test_an_edit_is_shown_as_the_real_cli_applies_it(
    tmp_path: Path, before: str, edit: tuple[str, str], removed: str, after: str
) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(before.encode())
    old, new = edit
    shown = await shown_then_approved(
        tmp_path, path, {"file_path": str(path), "old_string": old, "new_string": new}
    )
    assert removed in shown
    assert "not in the file" not in shown
    assert path.read_bytes().decode() == after

"""What a run changed in its git working directory, with real git (bridge/runs/changes.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bridge.runs.changes import changes, snapshot, summary_line


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.org")
    git(repo, "config", "user.name", "t")
    (repo / "app.py").write_text("a = 1\nb = 2\n")
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "start")
    return repo


async def test_edits_new_files_and_commits_all_count(repo: Path) -> None:
    (repo / "staged.txt").write_text("already staged\n")
    git(repo, "add", "staged.txt")
    before = await snapshot(repo)
    assert before is not None
    (repo / "app.py").write_text("a = 1\nb = 3\nc = 4\n")
    (repo / "new.py").write_text("x = 1\n")
    (repo / "committed.py").write_text("y = 2\n")
    git(repo, "add", "committed.py")
    git(repo, "commit", "-qm", "the run commits")
    (repo / "debug.log").write_text("ignored\n")
    (repo / ".chatbridge" / "inbox").mkdir(parents=True)
    (repo / ".chatbridge" / "inbox" / "shared.txt").write_text("chatbridge's own\n")
    found = await changes(before)
    assert found is not None
    by_path = {f.path: (f.added, f.removed) for f in found.files}
    assert by_path == {"app.py": (2, 1), "new.py": (1, 0), "committed.py": (1, 0)}
    assert "+c = 4" in found.patch
    assert summary_line(found).startswith("Changed 3 files (+4 -1): ")


async def test_the_repositorys_own_index_and_branch_are_left_alone(repo: Path) -> None:
    (repo / "app.py").write_text("edited\n")
    status = git(repo, "status", "--porcelain")
    head = git(repo, "rev-parse", "HEAD")
    before = await snapshot(repo)
    assert before is not None
    assert git(repo, "status", "--porcelain") == status
    assert git(repo, "rev-parse", "HEAD") == head
    assert git(repo, "stash", "list") == ""


async def test_nothing_changed_gives_no_summary(repo: Path) -> None:
    (repo / "app.py").write_text("uncommitted before the run\n")
    before = await snapshot(repo)
    assert before is not None
    assert await changes(before) is None


async def test_a_directory_outside_git_gets_no_snapshot(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert await snapshot(plain) is None


async def test_a_cwd_below_the_top_sees_the_whole_repository(repo: Path) -> None:
    sub = repo / "pkg"
    sub.mkdir()
    before = await snapshot(sub)
    assert before is not None
    (repo / "app.py").write_text("changed from below\n")
    (sub / ".chatbridge").mkdir()
    (sub / ".chatbridge" / "x").write_text("own\n")
    found = await changes(before)
    assert found is not None
    assert [f.path for f in found.files] == ["app.py"]


async def test_binary_files_and_renames_are_named(repo: Path) -> None:
    before = await snapshot(repo)
    assert before is not None
    (repo / "blob.bin").write_bytes(bytes(range(256)) * 4)
    git(repo, "mv", "app.py", "main.py")
    found = await changes(before)
    assert found is not None
    by_path = {f.path: (f.added, f.removed) for f in found.files}
    assert by_path["blob.bin"] == (None, None)
    assert "main.py" in by_path
    assert "binary" in summary_line(found)


async def test_file_names_cannot_break_the_summary_line(repo: Path) -> None:
    # A run names files as it likes: a backtick must not close the code span, a newline
    # or an escape sequence must not reach the chat as such.
    before = await snapshot(repo)
    assert before is not None
    names = ["a`@room`b.txt", "two\nlines.txt", "bell\x1b[31mred.txt"]
    for name in names:
        (repo / name).write_text("x\n")
    found = await changes(before)
    assert found is not None
    line = summary_line(found)
    assert "\n" not in line
    assert "\x1b" not in line
    # The backtick name sits whole in one code span (fenced with two backticks).
    assert "``a`@room`b.txt``" in line


async def test_a_diff_over_the_limit_is_not_read_whole(repo: Path) -> None:
    # A run that writes a big text file (a log, a data set) must not have its whole diff
    # read into the bridge's memory when only the size decides it is not attached.
    before = await snapshot(repo)
    assert before is not None
    (repo / "data.csv").write_text("1,2,3\n" * 400_000)  # 2.4 MB of diff
    found = await changes(before, max_patch_bytes=10_000)
    assert found is not None
    assert [(f.path, f.added) for f in found.files] == [("data.csv", 400_000)]
    assert found.patch == ""
    assert found.patch_over
    small = await changes(before, max_patch_bytes=10_000_000)
    assert small is not None
    assert not small.patch_over
    assert "+1,2,3" in small.patch


@pytest.mark.parametrize(
    ("config", "attributes"),
    [
        ({"core.fsmonitor": "{hook}"}, ""),
        ({"filter.pwn.clean": "{hook}", "filter.pwn.process": "{hook}"}, "*.txt filter=pwn\n"),
        ({"diff.pwn.textconv": "{hook}"}, "*.txt diff=pwn\n"),
        ({"core.hooksPath": "{hooks}"}, ""),
    ],
)
async def test_a_run_that_writes_git_config_gets_no_command_run_by_the_summary(
    repo: Path, tmp_path: Path, config: dict[str, str], attributes: str
) -> None:
    # A run allowed to edit files may write .git/config (and .gitattributes): git commands
    # chatbridge runs there itself, with no approval asked, must not run what it names.
    ran = tmp_path / "ran"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {ran}\ncat\n")
    hook.chmod(0o755)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "post-index-change").symlink_to(hook)
    before = await snapshot(repo)
    assert before is not None
    for key, value in config.items():
        git(repo, "config", key, value.format(hook=hook, hooks=hooks))
    if attributes:
        (repo / ".gitattributes").write_text(attributes)
    (repo / "note.txt").write_text("hello\n")
    found = await changes(before)
    assert found is not None
    assert "note.txt" in [f.path for f in found.files]
    assert "+hello" in found.patch
    again = await snapshot(repo)
    assert again is not None
    assert not ran.exists()

"""Thread conversations in git worktrees of their own (``worktree = true``), through
the real service and real git."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from bridge.config import load_settings
from bridge.core.model import ReplyKind
from bridge.errors import ConfigError
from bridge.host.worktrees import slug
from tests.bridge.chat_room import GUARD_S, serving
from tests.bridge.git_repos import (
    AT_ONCE,
    git,
    notices,
)
from tests.bridge.harness import ECHO, write_config


async def test_each_thread_works_in_its_own_worktree(tmp_path: Path, repo: Path) -> None:
    record = tmp_path / "record.json"
    config = {
        "dispatcher": AT_ONCE,
        "defaults": {"conversation": "thread", "worktree": True, "cwd": repo},
    }
    env = {**ECHO, "FAKE_CLAUDE_RECORD": str(record)}
    settings = load_settings(write_config(tmp_path, config, env=env))
    trees = {t: repo / ".chatbridge" / "worktrees" / slug(t) for t in ("1700.01", "$ev:hs")}
    async with serving(settings) as (service, chat):
        cwds = []
        for done, thread in enumerate(trees, start=1):
            await chat.say("work", thread=thread)
            await chat.wait_until(lambda: len(chat.texts(ReplyKind.RESULT)) == done)  # noqa: B023
            cwds.append(json.loads(record.read_text())["cwd"])
        assert cwds == [str(path) for path in trees.values()]
        branches = git(repo, "branch", "--format=%(refname:short)").splitlines()
        assert sorted(branches) == sorted(["main", *(f"chatbridge/{slug(t)}" for t in trees)])
        # The room's own checkout does not see them.
        assert git(repo, "status", "--porcelain") == ""

        await chat.say("!status", thread="1700.01")
        await chat.wait_until(lambda: len(notices(chat)) == 1)
        assert f"Worktree: `{trees['1700.01']}` on branch `chatbridge/" in notices(chat)[0]

        # Uncommitted work keeps a worktree; a clean one goes with its branch.
        # (Once the runs have ended: an answer is out before its run has wound down.)
        async with asyncio.timeout(GUARD_S):
            await service.parts.dispatcher.wait_idle()
        (trees["1700.01"] / "draft.txt").write_text("half done\n")
        await chat.say("!reset", thread="1700.01")
        await chat.say("!reset", thread="$ev:hs")
        await chat.wait_until(lambda: len(notices(chat)) == 3)
        kept, removed = notices(chat)[1:]
        assert "stays: 1 uncommitted change(s)" in kept
        assert "Removed the thread's worktree" in removed
        assert trees["1700.01"].exists()
        assert not trees["$ev:hs"].exists()

        # Committed but not pushed: still kept.
        git(trees["1700.01"], "add", "draft.txt")
        git(trees["1700.01"], "commit", "-q", "-m", "draft")
        await chat.say("!reset", thread="1700.01")
        await chat.wait_until(lambda: len(notices(chat)) == 4)
        assert "1 commit(s) on `chatbridge/" in notices(chat)[3]
        assert "not pushed" in notices(chat)[3]

        # Pushed: nothing would be lost, so it goes, branch and all.
        remote = tmp_path / "remote.git"
        git(tmp_path, "init", "-q", "--bare", str(remote))
        git(repo, "remote", "add", "origin", str(remote))
        git(trees["1700.01"], "push", "-q", "origin", f"chatbridge/{slug('1700.01')}")
        await chat.say("!reset", thread="1700.01")
        await chat.wait_until(lambda: len(notices(chat)) == 5)
        assert "Removed the thread's worktree" in notices(chat)[4]
    assert not trees["1700.01"].exists()
    assert git(repo, "branch", "--format=%(refname:short)").splitlines() == ["main"]
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


async def test_a_worktree_room_outside_git_fails_the_run_clearly(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    config = {
        "dispatcher": AT_ONCE,
        "defaults": {"conversation": "thread", "worktree": True, "cwd": plain},
    }
    settings = load_settings(write_config(tmp_path, config))
    async with serving(settings) as (_, chat):
        await chat.say("work", thread="t1")
        await chat.wait_until(lambda: any("git repository" in t for t in chat.texts()))
    assert not chat.texts(ReplyKind.RESULT)
    [said] = [r for r in chat.replies if "git repository" in r.text]
    assert said.thread == "t1"


def test_worktrees_need_thread_conversations(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match='worktree = true needs conversation = "thread"'):
        load_settings(write_config(tmp_path, {"defaults": {"worktree": True}}))


async def test_a_cwd_below_the_repository_root_runs_in_the_same_place_of_the_worktree(
    tmp_path: Path, repo: Path
) -> None:
    sub = repo / "service"
    sub.mkdir()
    (sub / "code.py").write_text("x = 1\n")
    git(repo, "add", "service")
    git(repo, "commit", "-q", "-m", "sub")
    record = tmp_path / "record.json"
    config = {
        "dispatcher": AT_ONCE,
        "defaults": {"conversation": "thread", "worktree": True, "cwd": sub},
    }
    env = {**ECHO, "FAKE_CLAUDE_RECORD": str(record)}
    settings = load_settings(write_config(tmp_path, config, env=env))
    async with serving(settings) as (_, chat):
        await chat.say("work", thread="t1")
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.RESULT)) == 1)
    cwd = Path(json.loads(record.read_text())["cwd"])
    # The run works where the room's cwd is, in the thread's own checkout.
    assert (cwd / "code.py").exists(), cwd
    assert git(cwd, "rev-parse", "--abbrev-ref", "HEAD") == f"chatbridge/{slug('t1')}"
    # And the main checkout does not see the worktrees.
    assert git(repo, "status", "--porcelain") == ""


async def test_without_git_a_worktree_room_fails_the_run_clearly(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {
        "dispatcher": AT_ONCE,
        "defaults": {"conversation": "thread", "worktree": True, "cwd": repo},
    }
    settings = load_settings(write_config(tmp_path, config))
    empty = tmp_path / "no-git-here"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    async with serving(settings) as (_, chat):
        await chat.say("work", thread="t1")
        await chat.wait_until(lambda: any("git" in t for t in chat.texts()))
        await chat.say("!reset", thread="t1")
        await chat.wait_until(lambda: any("new Claude session" in t for t in chat.texts()))
    assert not chat.texts(ReplyKind.RESULT)
    [said] = [t for t in chat.texts() if "git" in t and "session" not in t]
    assert "internal error" not in said
    assert "could not run git" in said


async def test_a_worktree_deleted_by_hand_is_made_again(tmp_path: Path, repo: Path) -> None:
    config = {
        "dispatcher": AT_ONCE,
        "defaults": {"conversation": "thread", "worktree": True, "cwd": repo},
    }
    settings = load_settings(write_config(tmp_path, config))
    tree = repo / ".chatbridge" / "worktrees" / slug("t1")
    async with serving(settings) as (_, chat):
        await chat.say("work", thread="t1")
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.RESULT)) == 1)
        # Cleaned up with rm -rf, not git worktree remove: git still lists it.
        shutil.rmtree(tree)
        # The user's own worktree on a drive not mounted now is none of ours.
        git(repo, "worktree", "add", "-q", "-b", "mine", str(tmp_path / "usb" / "mine"))
        shutil.rmtree(tmp_path / "usb")
        await chat.say("more work", thread="t1")
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.RESULT)) == 2 or bool(notices(chat)))
    assert chat.texts(ReplyKind.RESULT) == ["work", "more work"], notices(chat)
    assert (tree / ".git").exists()
    assert str(tmp_path / "usb" / "mine") in git(repo, "worktree", "list")


async def test_a_cwd_the_commit_does_not_have_is_made_in_the_worktree(
    tmp_path: Path, repo: Path
) -> None:
    """The room's cwd is a directory git does not track (nothing committed there
    yet): the thread's checkout lacks it, and the run starts there all the same."""
    sub = repo / "new-work"
    sub.mkdir()
    record = tmp_path / "record.json"
    config = {
        "dispatcher": AT_ONCE,
        "defaults": {"conversation": "thread", "worktree": True, "cwd": sub},
    }
    env = {**ECHO, "FAKE_CLAUDE_RECORD": str(record)}
    settings = load_settings(write_config(tmp_path, config, env=env))
    async with serving(settings) as (_, chat):
        await chat.say("work", thread="t1")
        await chat.wait_until(lambda: bool(chat.texts(ReplyKind.RESULT)) or bool(notices(chat)))
    assert chat.texts(ReplyKind.RESULT) == ["work"], notices(chat)
    tree = sub / ".chatbridge" / "worktrees" / slug("t1")
    assert json.loads(record.read_text())["cwd"] == str(tree / "new-work")


async def test_reset_keeps_the_branchs_commits_when_the_worktree_left_the_branch(
    tmp_path: Path, repo: Path
) -> None:
    """The run committed on the thread's branch, then checked out something else
    (a detached HEAD): the branch's commits are still unpushed work."""
    config = {
        "dispatcher": AT_ONCE,
        "defaults": {"conversation": "thread", "worktree": True, "cwd": repo},
    }
    settings = load_settings(write_config(tmp_path, config))
    tree = repo / ".chatbridge" / "worktrees" / slug("t1")
    branch = f"chatbridge/{slug('t1')}"
    async with serving(settings) as (_, chat):
        await chat.say("work", thread="t1")
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.RESULT)) == 1)
        (tree / "work.txt").write_text("done\n")
        git(tree, "add", "work.txt")
        git(tree, "commit", "-q", "-m", "the work")
        git(tree, "checkout", "-q", "--detach", "HEAD~1")
        await chat.say("!reset", thread="t1")
        await chat.wait_until(lambda: bool(notices(chat)))
    assert "stays" in notices(chat)[0], notices(chat)[0]
    assert git(repo, "log", "--format=%s", "-1", branch) == "the work"


async def test_a_file_claude_sends_from_its_worktree_is_the_worktrees(
    tmp_path: Path, repo: Path
) -> None:
    """``send_file`` paths are relative to where claude runs: the thread's worktree,
    never the room's own checkout (which has a file of the same name)."""
    (repo / "report.txt").write_text("committed\n")
    git(repo, "add", "report.txt")
    git(repo, "commit", "-q", "-m", "report")
    (repo / "report.txt").write_text("the main checkout's own edit\n")
    config = {
        "dispatcher": AT_ONCE,
        "defaults": {"conversation": "thread", "worktree": True, "cwd": repo},
    }
    env = {
        **ECHO,
        "FAKE_CLAUDE_SEND_FILE": json.dumps({"path": "report.txt", "comment": "Here."}),
    }
    settings = load_settings(write_config(tmp_path, config, env=env))
    async with serving(settings) as (_, chat):
        await chat.say("send the report", thread="t1")
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.RESULT)) == 1)
    [(posted, data)] = chat.posted_files
    assert data == b"committed\n"
    assert posted.thread == "t1"

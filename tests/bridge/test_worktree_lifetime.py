"""Threads' worktrees have a lifetime: idle ones are removed without losing work, and
``!worktrees`` lists and prunes them (issue 25: in a thread room every top-level
message left a checkout and a branch behind, removed only by a ``!reset`` in it).
Through the real service and real git."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from bridge.config import RoomSettings, load_settings
from bridge.core.model import ReplyKind, RoomId, RoomKey, TransportName
from bridge.host.worktrees import Worktrees, slug, worktree_of
from bridge.runs.worktree_lifetime import Lifetimes, listing
from tests.bridge.chat_room import GUARD_S, ChatRoom, serving
from tests.bridge.git_repos import (
    AT_ONCE,
    git,
    notices,
)
from tests.bridge.harness import write_config

DAY_S = 86400.0


def tree_of(repo: Path, thread: str) -> Path:
    return repo / ".chatbridge" / "worktrees" / slug(thread)


def branch_of(thread: str) -> str:
    return f"chatbridge/{slug(thread)}"


def idle_for(repo: Path, thread: str, days: float) -> None:
    """The thread's last run started ``days`` ago (its worktree's stamp says so)."""
    stamp = tree_of(repo, thread).with_name(slug(thread) + ".base")
    then = time.time() - days * DAY_S
    os.utime(stamp, (then, then))


def branches(repo: Path) -> list[str]:
    return sorted(git(repo, "branch", "--format=%(refname:short)").splitlines())


async def run_threads(chat: ChatRoom, *threads: str) -> None:
    for done, thread in enumerate(threads, start=1):
        await chat.say("work", thread=thread)
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.RESULT)) == done)  # noqa: B023


def config(repo: Path, **room: object) -> dict[str, object]:
    defaults = {"conversation": "thread", "worktree": True, "cwd": repo, **room}
    return {"dispatcher": AT_ONCE, "defaults": defaults}


async def test_idle_worktrees_go_and_uncommitted_work_stays_on_the_branch(
    tmp_path: Path, repo: Path
) -> None:
    settings = load_settings(write_config(tmp_path, config(repo, worktree_idle_days=7)))
    async with serving(settings) as (service, chat):
        await run_threads(chat, "clean", "draft", "recent")
        async with asyncio.timeout(GUARD_S):
            await service.parts.dispatcher.wait_idle()
        (tree_of(repo, "draft") / "draft.txt").write_text("half done\n")
        (tree_of(repo, "draft") / "README").write_text("edited\n")
        idle_for(repo, "clean", 8)
        idle_for(repo, "draft", 30)
        idle_for(repo, "recent", 6)
        await service.parts.lifetimes.sweep()
        await chat.wait_until(lambda: len(notices(chat)) == 2)
        told = {r.thread: r.text for r in chat.replies if r.kind is ReplyKind.NOTICE}
        # The thread that comes back later works on its branch again, with its work.
        await chat.say("more work", thread="draft")
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.RESULT)) == 4)
        back = (tree_of(repo, "draft") / "draft.txt").read_text()
    assert not tree_of(repo, "clean").exists()
    assert branch_of("clean") not in branches(repo)
    assert "no run for 7 days: Removed" in told["clean"]
    assert tree_of(repo, "recent").exists()
    # The draft's changes were committed to its branch, which stayed.
    assert f"its work stays on branch `{branch_of('draft')}`" in told["draft"]
    assert "committed there as" in told["draft"]
    shown = git(repo, "show", "--name-only", "--format=%an", branch_of("draft")).split()
    assert shown[0] == "chatbridge"
    assert sorted(shown[1:]) == ["README", "draft.txt"]
    assert back == "half done\n"
    assert git(repo, "status", "--porcelain") == ""


async def test_a_worktree_in_use_or_off_its_branch_stays(tmp_path: Path, repo: Path) -> None:
    go = tmp_path / "go"
    settings = load_settings(
        write_config(
            tmp_path,
            config(repo, worktree_idle_days=1),
            env={"FAKE_CLAUDE_ECHO": "1", "FAKE_CLAUDE_WAIT_FOR": str(go)},
        )
    )
    async with serving(settings) as (service, chat):
        go.touch()
        await run_threads(chat, "detached")
        async with asyncio.timeout(GUARD_S):
            await service.parts.dispatcher.wait_idle()
        go.unlink()
        detached = tree_of(repo, "detached")
        git(detached, "checkout", "-q", "--detach")
        (detached / "notes.txt").write_text("mine\n")
        await chat.say("a long one", thread="busy")
        await chat.wait_until(lambda: tree_of(repo, "busy").exists())
        idle_for(repo, "detached", 2)
        idle_for(repo, "busy", 2)
        await service.parts.lifetimes.sweep()
        await chat.wait_until(lambda: len(notices(chat)) == 1)
        assert tree_of(repo, "busy").exists()  # its run works in it
        go.touch()
        await chat.wait_until(lambda: len(chat.texts(ReplyKind.RESULT)) == 2)
    [told] = notices(chat)
    assert "stays (no run for 1 days): it is not on its branch" in told
    assert (detached / "notes.txt").read_text() == "mine\n"


async def test_worktrees_are_listed_and_pruned_by_approvers_only(
    tmp_path: Path, repo: Path
) -> None:
    strict = load_settings(write_config(tmp_path, config(repo, approvers=["@boss:hs"])))
    async with serving(strict) as (_, chat):
        await run_threads(chat, "t1", "t2")
        await chat.say("!worktrees")
        await chat.say("!worktrees prune")
        await chat.wait_until(lambda: len(notices(chat)) == 2)
        listed, refused = notices(chat)
    assert listed.startswith("2 thread worktree(s):")
    assert f"`{branch_of('t1')}` at `{tree_of(repo, 't1')}`: no run for" in listed
    assert "approver" in refused
    assert tree_of(repo, "t1").exists()
    assert tree_of(repo, "t2").exists()

    approvers = load_settings(write_config(tmp_path, config(repo)))
    async with serving(approvers) as (_, chat):
        await chat.say("!worktrees prune")
        await chat.wait_until(lambda: any(t.startswith("Pruned") for t in notices(chat)))
        await chat.say("!worktrees")
        await chat.wait_until(lambda: notices(chat)[-1].startswith("This room has no"))
    assert "Pruned 2 worktrees" in " ".join(notices(chat))
    assert branches(repo) == ["main"]


async def test_a_worktree_another_replica_runs_in_stays(repo: Path) -> None:
    """Replicas may share a working directory: a run marked running in the store, on
    any replica, keeps its thread's worktree, however old its stamp."""
    room = RoomKey(TransportName("slack"), RoomId("C1"))
    settings = RoomSettings(key=room, cwd=repo, conversation="thread", worktree=True)
    worktrees = Worktrees()
    for thread in ("mine", "theirs"):
        tree = worktree_of(room.in_thread(thread), settings)
        assert tree is not None
        await worktrees.ensure(tree)
        idle_for(repo, thread, 30)
    told: list[tuple[RoomKey, str]] = []

    async def running() -> list[RoomKey]:
        return [room.in_thread("theirs")]

    async def say(where: RoomKey, text: str) -> None:
        told.append((where, text))

    lifetimes = Lifetimes(worktrees, lambda: [(room, settings)], lambda _: [], running, say)
    listed = listing(await lifetimes.found(room, settings))
    await lifetimes.sweep()
    assert not tree_of(repo, "mine").exists()
    assert tree_of(repo, "theirs").exists()
    assert [where for where, _ in told] == [room.in_thread("mine")]
    assert f"`{branch_of('theirs')}` at `{tree_of(repo, 'theirs')}`: in use" in listed


async def test_rooms_sharing_a_repository_prune_only_their_own_worktrees(repo: Path) -> None:
    """Two rooms may work in one repository (one cwd): a prune in one neither removes
    the other's worktrees (one with a run starting in it above all) nor tells it there."""
    ours = RoomKey(TransportName("slack"), RoomId("C1"))
    theirs = RoomKey(TransportName("slack"), RoomId("C2"))
    rooms = [
        (room, RoomSettings(key=room, cwd=repo, conversation="thread", worktree=True))
        for room in (ours, theirs)
    ]
    worktrees = Worktrees()
    for (room, settings), thread in zip(rooms, ("mine", "busy"), strict=True):
        tree = worktree_of(room.in_thread(thread), settings)
        assert tree is not None
        await worktrees.ensure(tree)
    busy = {theirs: [theirs.in_thread("busy")]}
    told: list[tuple[RoomKey, str]] = []

    async def running() -> list[RoomKey]:
        return []

    async def say(where: RoomKey, text: str) -> None:
        told.append((where, text))

    lifetimes = Lifetimes(worktrees, lambda: rooms, lambda r: busy.get(r, []), running, say)
    listed = listing(await lifetimes.found(ours, rooms[0][1]))
    pruned = await lifetimes.prune(ours, rooms[0][1], 0.0, "pruned")
    assert tree_of(repo, "busy").exists()
    assert not tree_of(repo, "mine").exists()
    assert pruned == 1
    assert [where for where, _ in told] == [ours.in_thread("mine")]
    assert branch_of("busy") not in listed


async def test_a_worktree_made_before_it_named_its_room_gets_it_at_its_next_run(
    repo: Path,
) -> None:
    room = RoomKey(TransportName("slack"), RoomId("C1"))
    other = RoomKey(TransportName("slack"), RoomId("C2"))
    settings = RoomSettings(key=room, cwd=repo, conversation="thread", worktree=True)
    tree = worktree_of(room.in_thread("old"), settings)
    assert tree is not None
    worktrees = Worktrees()
    await worktrees.ensure(tree)
    tree.thread_file.write_text("old\n", encoding="utf-8")  # as an earlier version wrote it

    async def running() -> list[RoomKey]:
        return []

    async def say(where: RoomKey, text: str) -> None:
        pass

    lifetimes = Lifetimes(worktrees, lambda: [(room, settings)], lambda _: [], running, say)
    assert len(await lifetimes.found(other, settings)) == 1  # not known whose: seen by all
    await worktrees.ensure(tree)
    assert await lifetimes.found(other, settings) == []
    assert [f.tree.thread for f in await lifetimes.found(room, settings)] == ["old"]

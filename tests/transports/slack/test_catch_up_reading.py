"""What the catch-up reads of a channel's history, for any history and marks: every
message after its mark and the cutoff, once, oldest first; nothing else.

A Web API stand-in that answers as Slack documents ``conversations.history``
(top-level messages, newest first, each thread's parent with ``reply_count``,
``latest_reply`` and ``reply_users``) and ``conversations.replies`` (the parent,
then its replies). It ignores ``oldest``, as local-slack does: the reader must not
rely on it.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st
from slack_sdk.web.async_client import AsyncWebClient

from transports.slack.catch_up import History

BRIDGE = "U0BOT"


def ts(n: int) -> str:
    return f"1700000000.{n:06d}"


class Channel:
    def __init__(self, threads: dict[int, list[int]]) -> None:
        self.threads = threads

    async def conversations_history(self, **_: Any) -> dict[str, Any]:
        messages = []
        for parent in sorted(self.threads, reverse=True):
            message: dict[str, Any] = {"type": "message", "user": "U1", "ts": ts(parent)}
            if replies := self.threads[parent]:
                message.update(
                    thread_ts=ts(parent),
                    reply_count=len(replies),
                    latest_reply=ts(max(replies)),
                    reply_users=["U1"],
                )
            messages.append(message)
        return {"ok": True, "messages": messages, "has_more": False}

    async def conversations_replies(self, *, ts: str, **_: Any) -> dict[str, Any]:
        parent = next(p for p in self.threads if globals()["ts"](p) == ts)
        found = [{"type": "message", "user": "U1", "ts": ts, "thread_ts": ts}]
        found += [
            {"type": "message", "user": "U1", "ts": globals()["ts"](r), "thread_ts": ts}
            for r in sorted(self.threads[parent])
        ]
        return {"ok": True, "messages": found, "has_more": False}


@st.composite
def histories(draw: st.DrawFn) -> tuple[dict[int, list[int]], dict[str, str], int]:
    stamps = draw(st.lists(st.integers(1, 500), min_size=1, max_size=30, unique=True))
    stamps.sort()
    threads: dict[int, list[int]] = {}
    for n in stamps:
        parents = [p for p in threads if p < n]
        reply: bool = draw(st.booleans())
        if parents and reply:
            threads[draw(st.sampled_from(parents))].append(n)
        else:
            threads[n] = []
    marks: dict[str, str] = {}
    if draw(st.booleans()):
        marks[""] = ts(draw(st.integers(0, 500)))
    for parent in draw(st.lists(st.sampled_from(sorted(threads)), max_size=4)):
        marks[ts(parent)] = ts(draw(st.integers(parent, 500)))
    return threads, marks, draw(st.integers(0, 500))


@settings(max_examples=300, deadline=None)
@given(histories())
def test_every_message_after_its_mark_and_the_cutoff_is_read_once_in_order(
    history: tuple[dict[int, list[int]], dict[str, str], int],
) -> None:
    threads, marks, cutoff = history
    client = cast(AsyncWebClient, Channel(threads))
    missed = asyncio.run(History(client).missed("C1", marks, ts(cutoff), BRIDGE))
    got = [e["ts"] for e in missed.events]
    assert got == sorted(set(got))  # once each, oldest first
    assert all(e["channel"] == "C1" and e["type"] == "message" for e in missed.events)
    if "" not in marks:
        assert got == []  # a channel new to the bridge: none of its history
        return
    own = int(marks[""][-6:])
    expected = {ts(p) for p in threads if p > max(own, cutoff)}
    for parent, replies in threads.items():
        mark = marks.get(ts(parent))
        if parent > cutoff:
            after = max(int(mark[-6:]) if mark else own, cutoff)
        elif mark is not None and int(mark[-6:]) >= cutoff:
            after = int(mark[-6:])  # an old thread the bridge saw active lately
        else:
            continue
        expected |= {ts(r) for r in replies if r > after}
    assert set(got) == expected
    skipped = [p for p in threads if own < p <= cutoff]
    assert missed.skipped == len(skipped)

from __future__ import annotations

import asyncio

from bridge.core.model import ExternalMessageId
from bridge.progress import ProgressMessage, describe_tool_use


def test_tool_use_descriptions() -> None:
    assert describe_tool_use("Bash", {"command": "git status\ngit diff"}) == "Bash: git status"
    assert describe_tool_use("Edit", {"file_path": "src/app.py", "old": "x"}) == "Edit: src/app.py"
    assert describe_tool_use("TodoWrite", {"todos": []}) == "TodoWrite"
    long = describe_tool_use("Bash", {"command": "x" * 200})
    assert len(long) <= len("Bash: ") + 80
    assert long.endswith("…")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_updates_are_folded_into_one_edit_per_interval() -> None:
    clock = FakeClock()
    posted: list[str] = []
    edits: list[str] = []
    edited = asyncio.Event()

    async def post(text: str) -> ExternalMessageId:
        posted.append(text)
        return ExternalMessageId("status-1")

    async def edit(message_id: ExternalMessageId, text: str) -> bool:
        assert message_id == "status-1"
        edits.append(text)
        edited.set()
        return True

    progress = ProgressMessage(post=post, edit=edit, clock=clock, min_interval_s=0.0)
    await progress.start()
    assert posted == ["Working… 0s"]
    for i in range(5):
        progress.tool_used("Bash", {"command": f"step {i}"})
    clock.now += 3
    pump = asyncio.create_task(progress.pump())
    await edited.wait()
    pump.cancel()
    # Five updates before the pump ran: one edit, showing the latest three tools.
    assert len(edits) == 1
    assert edits[0].splitlines() == [
        "Working… 3s · 5 tool uses",
        "- Bash: step 2",
        "- Bash: step 3",
        "- Bash: step 4",
    ]
    await progress.finish("Done")
    assert edits[-1].startswith("Done after 3s")

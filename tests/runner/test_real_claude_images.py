"""The real claude binary takes images in its stream-json user message and passes them
to the model as image content (checked at the scripted model server)."""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.core.model import RunId, RunStatus
from runner import PromptImage, run_claude
from tests.fakes.model_server import ModelServer, Turn, claude_bin
from tests.runner.conftest import Recorder
from tests.runner.real_claude import real_request

pytestmark = [
    pytest.mark.slow,
    pytest.mark.claude,
    pytest.mark.skipif(not claude_bin().exists(), reason="claude binary not installed"),
]

PNG = base64.b64encode(
    base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
    )
).decode()


async def test_an_image_reaches_the_model_as_image_content(
    run_id: RunId, tmp_path: Path, recorder: Recorder
) -> None:
    async with ModelServer([Turn(text="a single dot")]) as server:
        request = real_request(run_id, tmp_path, server, "what is this?")
        report = await run_claude(
            replace(request, images=(PromptImage("image/png", PNG),)), recorder
        )
    assert report.status is RunStatus.SUCCEEDED, report
    assert report.result_text == "a single dot"
    first = server.agent_requests[0]
    blocks = [
        block
        for message in first.messages
        if message.get("role") == "user" and isinstance(message.get("content"), list)
        for block in message["content"]
    ]
    images = [b for b in blocks if b.get("type") == "image"]
    assert [i["source"] for i in images] == [
        {"type": "base64", "media_type": "image/png", "data": PNG}
    ]
    assert any(b.get("type") == "text" and "what is this?" in b.get("text", "") for b in blocks)

"""Questions claude asks (one choice, several, a plan) and the fake claude's scripts for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fakes.model_server import ModelServer, ToolCall, Turn

SINGLE = {
    "question": "Which database?",
    "header": "DB",
    "options": [
        {"label": "SQLite", "description": "a file"},
        {"label": "PostgreSQL", "description": "a server"},
    ],
    "multiSelect": False,
}


MULTI = {
    "question": "Which checks?",
    "header": "Checks",
    "options": [
        {"label": "ruff", "description": "lint"},
        {"label": "mypy", "description": "types"},
        {"label": "pytest", "description": "tests"},
    ],
    "multiSelect": True,
}


PLAN = "## Plan\n" + "\n".join(f"{i}. step {i}" for i in range(1, 40)) + "\n40. `rm -rf /srv/data`"


def told(server: ModelServer) -> list[str]:
    """Every text claude sent the model (tool results included)."""
    return [t for r in server.agent_requests for t in r.texts()]


def asking(*questions: dict[str, Any]) -> list[Turn]:
    return [
        Turn(tools=(ToolCall("AskUserQuestion", {"questions": list(questions)}),)),
        Turn(text="Thanks, noted."),
    ]


def planning(notes: Path) -> list[Turn]:
    return [
        Turn(tools=(ToolCall("ExitPlanMode", {"plan": PLAN}),)),
        Turn(tools=(ToolCall("Write", {"file_path": str(notes), "content": "notes\n"}),)),
        Turn(text="Plan carried out."),
    ]

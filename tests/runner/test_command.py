"""argv and environment building: pure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.core.model import RunId, SessionId
from runner import MARKER_ENV, InvalidRequest, RunRequest, build_argv, build_env
from runner.command import control_request, control_response, user_message
from runner.request import PromptImage

PROMPT = "rm -rf / ; $(whoami) `id` | & \n 'quoted' \"double\" ✓"


def request(**overrides: object) -> RunRequest:
    fields: dict[str, object] = {
        "run_id": RunId("run-1"),
        "claude_bin": "claude",
        "cwd": Path("/tmp"),
        "prompt": PROMPT,
        "session_id": None,
    }
    fields.update(overrides)
    return RunRequest(**fields)  # type: ignore[arg-type]


def test_minimal_argv() -> None:
    assert build_argv(request()) == [
        "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--input-format",
        "stream-json",
        "--replay-user-messages",
        "--",
    ]


def test_approve_tools_asks_over_stdio() -> None:
    argv = build_argv(request(approve_tools=True))
    assert argv[argv.index("--permission-prompt-tool") + 1] == "stdio"
    assert "--permission-prompt-tool" not in build_argv(request())


def test_images_go_after_the_text_as_base64_image_blocks() -> None:
    line = user_message(PROMPT, "u-1", [PromptImage("image/png", "aGk=")])
    assert json.loads(line)["message"]["content"] == [
        {"type": "text", "text": PROMPT},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}},
    ]


def test_stdin_lines_are_one_json_object_each() -> None:
    line = user_message(PROMPT, "u-1")
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert json.loads(line) == {
        "type": "user",
        "message": {"role": "user", "content": PROMPT},
        "uuid": "u-1",
    }
    assert json.loads(control_request("r-1", "set_model", model="opus")) == {
        "type": "control_request",
        "request_id": "r-1",
        "request": {"subtype": "set_model", "model": "opus"},
    }
    allow = json.loads(control_response("r-2", {"behavior": "allow", "updatedInput": {}}))
    assert allow["response"] == {
        "subtype": "success",
        "request_id": "r-2",
        "response": {"behavior": "allow", "updatedInput": {}},
    }


def test_every_option_in_order() -> None:
    argv = build_argv(
        request(
            session_id=SessionId("abc-123"),
            model="sonnet",
            permission_mode="acceptEdits",
            allowed_tools=("Bash(git *)", "Edit"),
            disallowed_tools=("WebFetch",),
            append_system_prompt="Be brief.",
            max_turns=7,
            extra_args=("--add-dir", "/srv"),
        )
    )
    assert argv == [
        "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--input-format",
        "stream-json",
        "--replay-user-messages",
        "--resume=abc-123",
        "--model",
        "sonnet",
        "--permission-mode",
        "acceptEdits",
        "--allowedTools",
        "Bash(git *)",
        "Edit",
        "--disallowedTools",
        "WebFetch",
        "--append-system-prompt",
        "Be brief.",
        "--max-turns",
        "7",
        "--add-dir",
        "/srv",
        "--",
    ]


def test_prompt_never_in_argv() -> None:
    argv = build_argv(request(allowed_tools=("Bash",), append_system_prompt="x"))
    assert all(PROMPT not in arg for arg in argv)


def test_argv_ends_options_so_variadic_tools_swallow_nothing() -> None:
    argv = build_argv(request(allowed_tools=("Bash",), disallowed_tools=("Edit",)))
    assert argv[-1] == "--"
    assert argv.count("--") == 1


@pytest.mark.parametrize("rule", ["--model", "-x", ""])
def test_tool_rule_that_looks_like_an_option_is_refused(rule: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid tool rule"):
        build_argv(request(allowed_tools=("Bash", rule)))


def test_negative_max_turns_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="max_turns"):
        build_argv(request(max_turns=-1))


def test_env_drops_claudecode_adds_extra_and_marker() -> None:
    base = {"PATH": "/usr/bin", "CLAUDECODE": "1", "HOME": "/root"}
    env = build_env(request(env={"ANTHROPIC_API_KEY": "k", "HOME": "/home/x"}), base)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/home/x",
        "ANTHROPIC_API_KEY": "k",
        MARKER_ENV: "run-1",
    }
    assert base["CLAUDECODE"] == "1"  # the service's own environment is untouched


def test_env_never_carries_the_bridges_own_settings_and_secrets() -> None:
    base = {
        "PATH": "/usr/bin",
        "CHATBRIDGE_SLACK__BOT_TOKEN": "xoxb-secret",
        "CHATBRIDGE_DATABASE__URL": "postgresql://u:hunter2@db/x",
        "CHATBRIDGE_CONFIG": "/etc/chatbridge.toml",
    }
    env = build_env(request(), base)
    assert env == {"PATH": "/usr/bin", MARKER_ENV: "run-1"}
    # A room may still give claude such a variable on purpose.
    assert build_env(request(env={"CHATBRIDGE_X": "1"}), base)["CHATBRIDGE_X"] == "1"


def test_extra_env_cannot_hide_the_marker_or_reintroduce_claudecode() -> None:
    env = build_env(request(env={MARKER_ENV: "other", "CLAUDECODE": "1"}), {})
    assert env == {MARKER_ENV: "run-1"}


def test_empty_run_id_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="empty run id"):
        build_env(request(run_id=RunId("")), {})


def test_max_budget_is_passed_only_when_set() -> None:
    assert "--max-budget-usd" not in build_argv(request())
    argv = build_argv(request(max_budget_usd=0.25, max_turns=3))
    assert argv[argv.index("--max-budget-usd") + 1] == "0.25"
    assert argv[-1] == "--"


@pytest.mark.parametrize("budget", [0.0, -1.0, float("nan")])
def test_a_budget_that_is_not_positive_is_refused(budget: float) -> None:
    with pytest.raises(InvalidRequest, match="max_budget_usd"):
        build_argv(request(max_budget_usd=budget))

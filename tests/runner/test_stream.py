"""NDJSON framing and decoding: pure."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.core.model import SessionId
from runner import (
    ApiRetry,
    AssistantText,
    Init,
    LineTooLong,
    MalformedLine,
    Result,
    ToolResult,
    ToolUse,
)
from runner.events import ControlAnswer, MessageTaken, PermissionAsked, PermissionCancelled
from runner.stream import LineFramer, parse_line


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


class TestFramer:
    def test_lines_split_across_chunks(self) -> None:
        framer = LineFramer(100)
        assert framer.feed(b'{"a"') == []
        assert framer.feed(b": 1}\n{") == [b'{"a": 1}']
        assert framer.feed(b'"b": 2}\n\n{"c":') == [b'{"b": 2}', b""]
        assert framer.feed(b"3}") == []
        assert framer.finish() == b'{"c":3}'
        assert framer.finish() is None

    def test_one_byte_at_a_time(self) -> None:
        framer = LineFramer(100)
        data = b"first\nsecond\n"
        lines = [ln for i in range(len(data)) for ln in framer.feed(data[i : i + 1])]
        assert lines == [b"first", b"second"]

    def test_huge_line_within_cap(self) -> None:
        big = b"x" * (5 * 1024 * 1024)
        framer = LineFramer(len(big))
        out: list[bytes] = []
        for i in range(0, len(big), 65536):
            out += framer.feed(big[i : i + 65536])
        out += framer.feed(b"\n")
        assert out == [big]

    def test_line_over_cap_fails_before_its_newline(self) -> None:
        framer = LineFramer(10)
        framer.feed(b"12345")
        with pytest.raises(LineTooLong, match="longer than 10 bytes"):
            framer.feed(b"678901")

    def test_line_over_cap_within_one_chunk(self) -> None:
        with pytest.raises(LineTooLong):
            LineFramer(4).feed(b"ok\ntoo long\n")

    def test_line_exactly_at_cap(self) -> None:
        assert LineFramer(4).feed(b"abcd\n") == [b"abcd"]


class TestParse:
    def test_init(self) -> None:
        events = parse_line(
            line(
                {
                    "type": "system",
                    "subtype": "init",
                    "session_id": "s1",
                    "model": "m",
                    "cwd": "/w",
                    "tools": ["Bash", "Edit"],
                    "permissionMode": "default",
                }
            )
        )
        assert events == [Init(SessionId("s1"), "m", "/w", ("Bash", "Edit"))]

    def test_assistant_blocks(self) -> None:
        msg = {
            "type": "assistant",
            "message": {
                "id": "m1",
                "content": [
                    {"type": "thinking", "thinking": "hidden"},
                    {"type": "text", "text": "hello"},
                    {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
        }
        assert parse_line(line(msg)) == [
            AssistantText("hello"),
            ToolUse("t1", "Bash", {"command": "ls"}),
        ]

    @pytest.mark.parametrize(
        ("content", "text"),
        [
            ("plain", "plain"),
            (
                [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}],
                "a\nb",
            ),
            (None, ""),
        ],
    )
    def test_tool_result_content_flattened(self, content: object, text: str) -> None:
        msg = {
            "type": "user",
            "message": {
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": content,
                        "is_error": True,
                    }
                ]
            },
        }
        assert parse_line(line(msg)) == [ToolResult("t1", text, True)]

    def test_user_text_is_not_an_event(self) -> None:
        assert parse_line(line({"type": "user", "message": {"content": "replayed prompt"}})) == []

    def test_result_success(self) -> None:
        msg = {
            "is_error": False,
            "num_turns": 2,
            "result": "answer",
            "session_id": "s1",
            "subtype": "success",
            "total_cost_usd": 0.25,
            "duration_ms": 1500,
            "type": "result",
        }
        assert parse_line(line(msg)) == [
            Result("success", False, "answer", SessionId("s1"), 0.25, 2, 1500, ())
        ]

    def test_result_error_with_odd_fields(self) -> None:
        msg = {
            "type": "result",
            "subtype": "error_during_execution",
            "is_error": True,
            "errors": ["boom", {"code": 1}],
            "num_turns": True,
            "total_cost_usd": "free",
        }
        (result,) = parse_line(line(msg))
        assert result == Result(
            "error_during_execution", True, "", None, None, None, None, ("boom", '{"code": 1}')
        )

    @pytest.mark.parametrize(
        "obj",
        [
            {"type": "system", "subtype": "status", "status": "compacting"},
            {"type": "system", "subtype": "compact_boundary"},
            {"type": "stream_event", "event": {}},
            {"type": "something_new"},
            {"no_type": 1},
            {"type": "assistant", "message": "not an object"},
            {"type": "assistant", "message": {"content": [{"type": "server_tool_use"}]}},
        ],
    )
    def test_unknown_types_and_subtypes_ignored(self, obj: dict[str, Any]) -> None:
        assert parse_line(line(obj)) == []

    def test_blank_line_ignored(self) -> None:
        assert parse_line(b"  \r") == []

    @pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'"text"', b"\xff\xfe", b'{"a": '])
    def test_garbage_is_an_error(self, raw: bytes) -> None:
        with pytest.raises(MalformedLine, match="malformed output line"):
            parse_line(raw)


class TestApiRetry:
    """``system/api_retry`` lines, with the fields claude 2.1 prints (seen against a 401)."""

    @staticmethod
    def retry(status: int | None, error: str) -> ApiRetry:
        obj = {
            "type": "system",
            "subtype": "api_retry",
            "attempt": 1,
            "max_retries": 10,
            "retry_delay_ms": 551,
            "error_status": status,
            "error": error,
            "session_id": "s",
            "uuid": "u",
        }
        [event] = parse_line(line(obj))
        assert isinstance(event, ApiRetry)
        return event

    def test_fields(self) -> None:
        assert self.retry(401, "authentication_failed") == ApiRetry(
            1, 10, 551, 401, "authentication_failed"
        )

    @pytest.mark.parametrize(
        ("status", "error"),
        [(401, "authentication_failed"), (403, ""), (None, "authentication_failed")],
    )
    def test_refused_credentials_are_auth_failures(self, status: int | None, error: str) -> None:
        assert self.retry(status, error).auth_failed

    @pytest.mark.parametrize(
        ("status", "error"),
        [(429, "rate_limit"), (529, "overloaded"), (500, "server_error"), (None, "unknown")],
    )
    def test_other_retries_are_not(self, status: int | None, error: str) -> None:
        assert not self.retry(status, error).auth_failed


def test_two_way_protocol_lines() -> None:
    replay = {"type": "user", "message": {"role": "user", "content": "hi"}, "uuid": "u-1"}
    assert parse_line(json.dumps({**replay, "isReplay": True}).encode()) == [MessageTaken("u-1")]
    ask = {
        "type": "control_request",
        "request_id": "r-1",
        "request": {
            "subtype": "can_use_tool",
            "tool_name": "Bash",
            "input": {"command": "touch x"},
            "tool_use_id": "toolu_1",
            "description": "Create x",
            "permission_suggestions": [{"type": "addRules"}, "junk"],
        },
    }
    assert parse_line(json.dumps(ask).encode()) == [
        PermissionAsked(
            "r-1", "Bash", {"command": "touch x"}, "toolu_1", "Create x", ({"type": "addRules"},)
        )
    ]
    other = {
        "type": "control_request",
        "request_id": "r-2",
        "request": {"subtype": "hook_callback"},
    }
    assert parse_line(json.dumps(other).encode()) == []
    answer = {
        "type": "control_response",
        "response": {"subtype": "error", "request_id": "cb-1", "error": "invalid_mode"},
    }
    assert parse_line(json.dumps(answer).encode()) == [
        ControlAnswer("cb-1", False, {}, "invalid_mode")
    ]
    cancel = {"type": "control_cancel_request", "request_id": "r-1"}
    assert parse_line(json.dumps(cancel).encode()) == [PermissionCancelled("r-1")]
    result = {"type": "result", "subtype": "success", "terminal_reason": "aborted_tools"}
    (parsed,) = parse_line(json.dumps(result).encode())
    assert isinstance(parsed, Result)
    assert parsed.terminal_reason == "aborted_tools"

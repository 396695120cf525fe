"""chatbridge's own tool rules: what a rule says, which request it covers (docs/live-runs.md).

Pure, no I/O. A rule is written in claude's rule syntax, ``Tool`` or
``Tool(pattern)``: ``Bash(npm test)`` is that command exactly,
``Bash(npm test:*)`` that command with any arguments; for the file tools
(``Read``, ``Edit``, ``MultiEdit``, ``Write``, ``NotebookEdit``) the pattern
is a path (``*`` within a directory, ``**`` across them); ``WebFetch(domain:
example.com)`` names a host; a bare tool name covers every use of the tool.
The bridge matches them itself (they never reach claude's settings), and
matches narrowly: a ``:*`` Bash rule never covers a command that chains,
pipes, redirects or substitutes, so ``Bash(npm test:*)`` does not allow
``npm test && rm -rf /``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bridge.store.base import RuleEffect, ToolRule
from bridge.store.rules import RULE_LIMIT_BYTES

_RULE = re.compile(r"(?P<tool>[A-Za-z_][A-Za-z0-9_.:-]{0,199})(?:\((?P<pattern>.*)\))?", re.DOTALL)
_PATH_TOOLS = frozenset({"Read", "Edit", "MultiEdit", "Write", "NotebookEdit"})
_PATH_KEYS = ("file_path", "notebook_path")
_PREFIX = ":*"
_SHELL_JOINS = re.compile(r"[;&|<>`\n\r]|\$\(")
"""What lets one Bash command line run more than its first command."""


@dataclass(frozen=True, slots=True)
class RuleText:
    """A rule taken apart: the tool, and the pattern (None: every use of the tool)."""

    tool: str
    pattern: str | None

    def __str__(self) -> str:
        return self.tool if self.pattern is None else f"{self.tool}({self.pattern})"


def keepable(rule: RuleText) -> bool:
    """Whether the store keeps ``rule`` (a command of many KB is asked each time)."""
    return len(str(rule).encode()) <= RULE_LIMIT_BYTES


def parse_rule(text: str) -> RuleText | None:
    """``text`` as a rule, or None if it is not one (empty pattern, bad tool name)."""
    match = _RULE.fullmatch(text.strip())
    if match is None:
        return None
    pattern = match["pattern"]
    if pattern is not None and not pattern.strip():
        return None
    return RuleText(match["tool"], pattern)


def rule_for(tool_name: str, tool_input: Mapping[str, Any]) -> RuleText:
    """The narrowest rule that covers this request again: the exact command, the file,
    the URL's host; for a tool with no such field, the tool (claude's own convention)."""
    command = tool_input.get("command")
    if tool_name == "Bash" and isinstance(command, str) and command.strip():
        return RuleText(tool_name, _exact(command))
    if tool_name in _PATH_TOOLS:
        path = _path(tool_input)
        if path:
            return RuleText(tool_name, _exact(path))
    url = tool_input.get("url")
    if tool_name == "WebFetch" and isinstance(url, str):
        host = urlsplit(url).hostname
        if host:
            return RuleText(tool_name, f"domain:{host}")
    return RuleText(tool_name, None)


def matches(rule: RuleText, tool_name: str, tool_input: Mapping[str, Any]) -> bool:
    """Whether ``rule`` covers claude's request to use ``tool_name`` with ``tool_input``."""
    if rule.tool != tool_name:
        return False
    if rule.pattern is None:
        return True
    if tool_name == "Bash":
        command = tool_input.get("command")
        return isinstance(command, str) and _command_matches(rule.pattern, command)
    if tool_name in _PATH_TOOLS:
        path = _path(tool_input)
        return path is not None and _glob(rule.pattern).fullmatch(path) is not None
    if tool_name == "WebFetch" and rule.pattern.startswith("domain:"):
        url = tool_input.get("url")
        host = urlsplit(url).hostname if isinstance(url, str) else None
        return host is not None and host == rule.pattern.removeprefix("domain:").lower()
    return False


def ruling(
    rules: Iterable[ToolRule], tool_name: str, tool_input: Mapping[str, Any]
) -> ToolRule | None:
    """The rule that decides the request: the first deny rule covering it, else the
    first allow rule, else None (the room is asked). Unparsable rules cover nothing."""
    covering = [
        rule
        for rule in rules
        if (text := parse_rule(rule.rule)) is not None and matches(text, tool_name, tool_input)
    ]
    denying = [rule for rule in covering if rule.effect is RuleEffect.DENY]
    return next(iter(denying or covering), None)


def _command_matches(pattern: str, command: str) -> bool:
    if not pattern.endswith(_PREFIX):
        return command.strip() == _unescape(pattern).strip()
    prefix = _unescape(pattern[: -len(_PREFIX)]).strip()
    if _SHELL_JOINS.search(command):
        return False
    words = command.split()
    wanted = prefix.split()
    return bool(wanted) and words[: len(wanted)] == wanted


def _path(tool_input: Mapping[str, Any]) -> str | None:
    for key in _PATH_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _glob(pattern: str) -> re.Pattern[str]:
    """A path pattern: ``**`` crosses directories, ``*`` and ``?`` do not; the rest is literal."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


_SPECIAL = re.compile(r"[\\*?()]")


def _exact(text: str) -> str:
    """``text`` as a pattern matching itself only: wildcards and parentheses escaped,
    and a trailing ``:*`` (which would make a prefix rule) escaped too."""
    return _SPECIAL.sub(lambda m: "\\" + m[0], text)


def _unescape(pattern: str) -> str:
    return re.sub(r"\\(.)", r"\1", pattern, flags=re.DOTALL)

"""chatbridge's own tool rules: what a rule says, which request it covers.

Pure, no I/O. Rules use claude's syntax (``Tool`` or ``Tool(pattern)``: commands, paths,
``domain:`` hosts) but the bridge matches them itself and they never reach claude's settings:
an allow rule narrowly (never a command that chains, pipes, redirects or substitutes; never a
path with ``..``), a deny rule broadly (each command of a line, the normalised path)
(docs/live-runs.md, "Tool rules").
"""

from __future__ import annotations

import contextlib
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

from bridge.live.questions import INTERACTIVE
from bridge.store.base import RuleEffect, ToolRule
from bridge.store.rules import RULE_LIMIT_BYTES

_RULE = re.compile(r"(?P<tool>[A-Za-z_][A-Za-z0-9_.:-]{0,199})(?:\((?P<pattern>.*)\))?", re.DOTALL)
_PATH_TOOLS = frozenset(
    {"Read", "Edit", "MultiEdit", "Write", "NotebookEdit", "Grep", "Glob", "LS"}
)
_PATH_KEYS = ("file_path", "notebook_path", "path")
"""(The searches' ``path`` is a directory: their rule covers searches of it.)"""
_PREFIX = ":*"
_SHELL_JOINS = re.compile(r"[;&|<>`\n\r]|\$\(")
"""What lets one Bash command line run more than its first command."""
_BLANKS = " \t"
"""What bash splits words on (Python's ``split()`` also splits on NBSP, ``\\x1c``...)."""
_COMMAND_BREAKS = re.compile(r"[;&|<>`\n\r(){}]|\$\(")
"""Where another command may start in a line (a deny rule looks at each)."""
_BEFORE_COMMAND = frozenset(
    {"if", "then", "else", "elif", "do", "while", "until", "!", "time"}
    | {"sudo", "env", "nohup", "exec", "command", "builtin", "nice", "xargs", "doas"}
)
"""Words after which a line's command may start (keywords, and the usual wrappers)."""
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_QUOTING = re.compile(r"['\"\\]")
_SPECIAL_SCHEMES = frozenset({"http", "https", "ws", "wss", "ftp", "file"})
"""Schemes whose URLs Node reads ``\\`` in as ``/`` (the WHATWG URL standard)."""


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
    if pattern is not None and not pattern.strip(_BLANKS + "\n\r"):
        return None
    return RuleText(match["tool"], pattern)


_BUILT_IN = {
    name.lower(): name
    for name in (
        *_PATH_TOOLS,
        "Bash",
        "WebFetch",
        "WebSearch",
        "Task",
        "TodoWrite",
        "BashOutput",
        "KillShell",
        "ExitPlanMode",
        "AskUserQuestion",
    )
}


DENY_REACH = (
    "A deny rule stops only what claude asks for: not what its permission mode lets it"
    " do unasked (reading files of its directory, commands like `cat`, edits under"
    " `acceptEdits`)."
)
"""Told with every deny rule kept, so the room does not believe it stops more."""


def unmatchable(rule: RuleText) -> str | None:
    """Why ``rule`` could never cover a request (the room would believe it holds);
    None if it can."""
    known = _BUILT_IN.get(rule.tool.lower())
    if known is not None and known != rule.tool:
        return f"the tool is `{known}`, not `{rule.tool}`"
    if rule.pattern is None or rule.tool == "Bash":
        return None
    if rule.tool in _PATH_TOOLS:
        if rule.pattern.startswith(("/", "*")):
            return None
        return "claude names files by absolute path: start the pattern with `/` or `**/`"
    if rule.tool == "WebFetch":
        host = rule.pattern.removeprefix("domain:")
        if rule.pattern.startswith("domain:") and _normal_host(host) and "*" not in host:
            return None
        return "a WebFetch pattern is `domain:HOST`, one host exactly"
    return (
        "only Bash, the file tools, the searches and WebFetch take a pattern"
        " (a bare name covers every use)"
    )


def rule_for(tool_name: str, tool_input: Mapping[str, Any]) -> RuleText | None:
    """The narrowest rule that covers this request again: the exact command, the file,
    the URL's host; for another tool, the tool (claude's own convention). None when
    Bash, a file tool or WebFetch lacks its command, path or host: the rule would be
    the whole tool, far more than what was shown."""
    if tool_name == "Bash":
        command = tool_input.get("command")
        if isinstance(command, str) and command.strip(_BLANKS + "\n\r"):
            return RuleText(tool_name, _exact(command))
        return None
    if tool_name in _PATH_TOOLS:
        path = _path(tool_input)
        return RuleText(tool_name, _exact(path)) if path else None
    if tool_name == "WebFetch":
        host = _host(tool_input.get("url"))
        return RuleText(tool_name, f"domain:{host}") if host else None
    return RuleText(tool_name, None)


def matches(
    rule: RuleText,
    tool_name: str,
    tool_input: Mapping[str, Any],
    effect: RuleEffect = RuleEffect.ALLOW,
) -> bool:
    """Whether ``rule`` covers claude's request to use ``tool_name`` with ``tool_input``:
    narrowly for an allow rule, broadly for a deny rule (``effect``)."""
    if rule.tool != tool_name:
        return False
    if rule.pattern is None:
        return True
    deny = effect is RuleEffect.DENY
    if tool_name == "Bash":
        command = tool_input.get("command")
        if not isinstance(command, str):
            return False
        if deny:
            return _command_denied(rule.pattern, command)
        # Out of claude's sandbox is not the use the rule was kept for: asked each time.
        unsandboxed = tool_input.get("dangerouslyDisableSandbox") not in (None, False)
        return not unsandboxed and _command_matches(rule.pattern, command)
    if tool_name in _PATH_TOOLS:
        path = _path(tool_input)
        return path is not None and _path_matches(rule.pattern, path, deny)
    if tool_name == "WebFetch" and rule.pattern.startswith("domain:"):
        host = _host(tool_input.get("url"))
        return host is not None and host == _normal_host(rule.pattern.removeprefix("domain:"))
    return False


def ruling(
    rules: Iterable[ToolRule], tool_name: str, tool_input: Mapping[str, Any]
) -> ToolRule | None:
    """The rule that decides the request: the first deny rule covering it, else the
    first allow rule, else None (the room is asked). Unparsable rules cover nothing; no
    allow rule covers a question or a plan (a person answers it, having read it)."""
    covering = [
        rule
        for rule in rules
        if (text := parse_rule(rule.rule)) is not None
        and matches(text, tool_name, tool_input, rule.effect)
        and (rule.effect is RuleEffect.DENY or tool_name not in INTERACTIVE)
    ]
    denying = [rule for rule in covering if rule.effect is RuleEffect.DENY]
    return next(iter(denying or covering), None)


def _command_matches(pattern: str, command: str) -> bool:
    if not pattern.endswith(_PREFIX):
        return command.strip(_BLANKS) == _unescape(pattern).strip(_BLANKS)
    if _SHELL_JOINS.search(command):
        return False
    wanted = _words(_unescape(pattern[: -len(_PREFIX)]))
    return bool(wanted) and _words(command)[: len(wanted)] == wanted


def _command_denied(pattern: str, command: str) -> bool:
    """Whether a deny rule covers any command of the line: its words, unquoted and
    past assignments and keywords, start with (``:*``) or are the rule's."""
    prefix = pattern.endswith(_PREFIX)
    wanted = [
        _unquoted(w) for w in _words(_unescape(pattern[: -len(_PREFIX)] if prefix else pattern))
    ]
    if not wanted:
        return False
    for words in _commands(command):
        if words[: len(wanted)] == wanted and (prefix or len(words) == len(wanted)):
            return True
    return False


def _commands(line: str) -> Iterator[list[str]]:
    """Each command of the line as words, also from each word on that may start it
    (past keywords and assignments)."""
    for part in _COMMAND_BREAKS.split(line):
        words = [_unquoted(w) for w in _words(part)]
        while words:
            yield words
            if "/" in words[0]:  # /bin/rm is rm
                yield [posixpath.basename(words[0]), *words[1:]]
            if not (words[0] in _BEFORE_COMMAND or _ASSIGNMENT.match(words[0])):
                break
            words = words[1:]


def _words(text: str) -> list[str]:
    return [word for word in re.split(f"[{_BLANKS}]+", text) if word]


def _unquoted(word: str) -> str:
    return _QUOTING.sub("", word)


def _path_matches(pattern: str, path: str, deny: bool) -> bool:
    if deny:
        return _glob_matches(pattern, path) or _glob_matches(pattern, posixpath.normpath(path))
    # ``a/../b``: the kernel resolves ``a`` first (it may be a link), so no pattern
    # says where it leads.
    return ".." not in PurePosixPath(path).parts and _glob_matches(pattern, path)


def _host(url: object) -> str | None:
    """The host claude fetches ``url`` from, as Node's URL reads it; None if none."""
    if not isinstance(url, str):
        return None
    text = re.sub(r"[\t\n\r]", "", url.strip("".join(map(chr, range(0x21)))))
    if text.partition(":")[0].lower() in _SPECIAL_SCHEMES:
        text = text.replace("\\", "/")
    try:
        host = urlsplit(text).hostname
    except ValueError:
        return None
    return _normal_host(host) if host else None


def _normal_host(host: str) -> str | None:
    """``host`` as compared: percent-decoded, lower case, no trailing dot, IDNA."""
    name = unquote(host).lower().rstrip(".")
    with contextlib.suppress(UnicodeError):  # not a name IDNA takes: compared as it is
        name = name.encode("idna").decode("ascii")
    return name or None


def _path(tool_input: Mapping[str, Any]) -> str | None:
    for key in _PATH_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return value
    return None


_ANY = "**"
_WITHIN = "*"
_ONE = "?"


def _glob_matches(pattern: str, path: str) -> bool:
    """Whether ``path`` matches the path pattern: ``**`` crosses directories, ``*`` and
    ``?`` do not, ``\\`` escapes; the rest is literal. The pattern's steps are followed
    all at once (a set of positions), never by backtracking: time is the path's length
    times the pattern's, whatever either holds."""
    steps = _glob_steps(pattern)
    at = _past_stars(steps, {0})
    for char in path:
        moved = set()
        for i in at:
            if i == len(steps):
                continue
            special, text = steps[i]
            if special and text == _ANY:
                moved.add(i)
            elif special and text == _WITHIN:
                if char != "/":
                    moved.add(i)
            elif special:  # _ONE
                if char != "/":
                    moved.add(i + 1)
            elif text == char:
                moved.add(i + 1)
        at = _past_stars(steps, moved)
        if not at:
            return False
    return len(steps) in at


def _glob_steps(pattern: str) -> list[tuple[bool, str]]:
    """The pattern as steps: (True, a wildcard) or (False, a literal character)."""
    steps = []
    i = 0
    while i < len(pattern):
        if pattern.startswith(_ANY, i):
            steps.append((True, _ANY))
            i += 2
        elif pattern[i] in (_WITHIN, _ONE):
            steps.append((True, pattern[i]))
            i += 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            steps.append((False, pattern[i + 1]))
            i += 2
        else:
            steps.append((False, pattern[i]))
            i += 1
    return steps


def _past_stars(steps: list[tuple[bool, str]], at: set[int]) -> set[int]:
    """``at`` and the positions past the stars there (a star may match nothing)."""
    todo = list(at)
    reached = set(at)
    while todo:
        i = todo.pop()
        if i < len(steps) and steps[i] in ((True, _ANY), (True, _WITHIN)) and i + 1 not in reached:
            reached.add(i + 1)
            todo.append(i + 1)
    return reached


_SPECIAL = re.compile(r"[\\*?()]")


def _exact(text: str) -> str:
    """``text`` as a pattern matching itself only: wildcards and parentheses escaped,
    and a trailing ``:*`` (which would make a prefix rule) escaped too."""
    return _SPECIAL.sub(lambda m: "\\" + m[0], text)


def _unescape(pattern: str) -> str:
    return re.sub(r"\\(.)", r"\1", pattern, flags=re.DOTALL)

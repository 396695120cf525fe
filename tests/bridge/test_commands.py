from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.core.transport import ApprovalChoice
from bridge.inbound.commands import (
    REASON_LIMIT,
    CommandName,
    Decision,
    help_text,
    parse_command,
    parse_decision,
)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("!stop", CommandName.STOP),
        ("  !STATUS  ", CommandName.STATUS),
        ("!reset now please", CommandName.RESET),
        ("!retry", CommandName.RETRY),
        ("!help", CommandName.HELP),
    ],
)
def test_known_commands(text: str, name: CommandName) -> None:
    command = parse_command(text, "!")
    assert command is not None
    assert command.name is name


@pytest.mark.parametrize("text", ["hello", "! stop", "!!", "!", "stop!", "!123", "why !stop"])
def test_ordinary_messages_are_not_commands(text: str) -> None:
    assert parse_command(text, "!") is None


def test_unknown_command_word_is_reported_as_unknown() -> None:
    command = parse_command("!deploy prod", "!")
    assert command is not None
    assert command.name is None
    assert command.word == "deploy"


def test_custom_prefix() -> None:
    assert parse_command("!stop", "cb:") is None
    command = parse_command("cb:stop", "cb:")
    assert command is not None
    assert command.name is CommandName.STOP


def test_help_lists_every_command_with_prefix() -> None:
    text = help_text("?")
    for name in CommandName:
        assert f"`?{name}`" in text


def test_help_examples_are_commands_as_typed() -> None:
    # "`approve #N`" without the prefix, typed as shown, is a message to Claude (in a
    # steering room it goes straight into the running run), not an answer.
    text = help_text("?")
    for example in ("approve #N", "approve session #N", "deny #N reason", "retry RUN"):
        assert f"`?{example}`" in text
    assert "`approve" not in text
    assert "`deny" not in text
    assert "`model" not in text
    assert "`mode" not in text


def test_the_first_word_after_a_command_is_its_argument() -> None:
    named = parse_command("!retry run-0123abcd please", "!")
    bare = parse_command("  !retry  ", "!")
    assert named is not None
    assert bare is not None
    assert (named.name, named.argument) == (CommandName.RETRY, "run-0123abcd")
    assert (bare.name, bare.argument) == (CommandName.RETRY, "")


@pytest.mark.parametrize(
    ("text", "choice", "number", "reason"),
    [
        ("!approve", ApprovalChoice.ALLOW, None, ""),
        ("!approve #3", ApprovalChoice.ALLOW, 3, ""),
        ("!APPROVE session", ApprovalChoice.ALLOW_SESSION, None, ""),
        ("!approve session #12", ApprovalChoice.ALLOW_SESSION, 12, ""),
        ("!approve #12 Session", ApprovalChoice.ALLOW_SESSION, 12, ""),
        ("!deny", ApprovalChoice.DENY, None, ""),
        ("!deny #4", ApprovalChoice.DENY, 4, ""),
        ("!deny #4 Too  risky,\n really", ApprovalChoice.DENY, 4, "Too risky, really"),
        ("!deny #4\nno", ApprovalChoice.DENY, 4, "no"),
        ("!deny 4 tries is enough", ApprovalChoice.DENY, None, "4 tries is enough"),
        ("!deny not #4", ApprovalChoice.DENY, None, "not #4"),
        ("!deny not always", ApprovalChoice.DENY, None, "not always"),
    ],
)
def test_answers_to_tool_requests(
    text: str, choice: ApprovalChoice, number: int | None, reason: str
) -> None:
    command = parse_command(text, "!")
    assert command is not None
    assert parse_decision(command) == Decision(choice, number, reason)


@pytest.mark.parametrize(
    ("text", "choice", "number", "reason"),
    [
        ("!approve always", ApprovalChoice.ALLOW, None, ""),
        ("!approve #3 ALWAYS", ApprovalChoice.ALLOW, 3, ""),
        ("!deny always", ApprovalChoice.DENY, None, ""),
        ("!deny always #4 never in prod", ApprovalChoice.DENY, 4, "never in prod"),
        ("!deny Always not here", ApprovalChoice.DENY, None, "not here"),
    ],
)
def test_always_keeps_the_answer_as_a_rule_of_the_room(
    text: str, choice: ApprovalChoice, number: int | None, reason: str
) -> None:
    command = parse_command(text, "!")
    assert command is not None
    assert parse_decision(command) == Decision(choice, number, reason, for_room=True)


@pytest.mark.parametrize(
    "text",
    [
        "!approve 3",
        "!approve #3 #4",
        "!approve please",
        "!deny #x why",
        "!deny #",
        "!approve #-1",
        "!approve session always",
        "!approve always always",
        "!deny always #x",
    ],
)
def test_malformed_answers_are_refused_not_guessed(text: str) -> None:
    command = parse_command(text, "!")
    assert command is not None
    assert parse_decision(command) is None


def test_a_long_reason_is_cut() -> None:
    command = parse_command("!deny #1 " + "x" * 2000, "!")
    assert command is not None
    decision = parse_decision(command)
    assert decision is not None
    assert len(decision.reason) == REASON_LIMIT


_WORD = st.text(st.characters(blacklist_categories=("Cs", "Zs", "Cc")), min_size=1, max_size=12)


@given(
    number=st.none() | st.integers(min_value=0, max_value=10**12),
    words=st.lists(_WORD, max_size=6),
)
def test_a_reason_is_never_taken_for_an_id(number: int | None, words: list[str]) -> None:
    """Only a first word starting with ``#`` is an id; every other word is the reason."""
    words = [w for w in words if w.strip()]
    if words and number is None:
        words[0] = words[0].lstrip("#") or "why"
    if words and words[0].lower() == "always":
        words[0] = "why"  # ``always`` first keeps a room rule (tested above)
    head = [f"#{number}"] if number is not None else []
    command = parse_command(" ".join(["!deny", *head, *words]), "!")
    assert command is not None
    decision = parse_decision(command)
    assert decision is not None
    assert decision.number == number
    assert decision.reason == " ".join(" ".join(words).split())


@given(st.text(max_size=40))
def test_whatever_follows_deny_parses_or_is_refused(rest: str) -> None:
    command = parse_command(f"!deny {rest}", "!")
    if command is None:
        return
    decision = parse_decision(command)
    first, *after = command.rest.split(maxsplit=1) or [""]
    rest = " ".join(after) if first.lower() == "always" else command.rest
    if decision is None:
        assert rest.startswith("#")
    else:
        assert decision.choice is ApprovalChoice.DENY
        assert decision.for_room == (first.lower() == "always")
        assert (decision.number is None) != rest.startswith("#")


def test_rest_keeps_what_follows_the_command_word() -> None:
    command = parse_command("  !Deny   #2 Not THIS  ", "!")
    assert command is not None
    assert (command.word, command.argument, command.rest) == ("deny", "#2", "#2 Not THIS")

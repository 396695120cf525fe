from __future__ import annotations

import pytest

from bridge.commands import CommandName, help_text, parse_command


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


def test_the_first_word_after_a_command_is_its_argument() -> None:
    named = parse_command("!retry run-0123abcd please", "!")
    bare = parse_command("  !retry  ", "!")
    assert named is not None
    assert bare is not None
    assert (named.name, named.argument) == (CommandName.RETRY, "run-0123abcd")
    assert (bare.name, bare.argument) == (CommandName.RETRY, "")

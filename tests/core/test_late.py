"""A part bound late (bridge/core/late.py): the assembly's one way to close a cycle."""

from __future__ import annotations

import pytest

from bridge.core.late import Late


def test_a_late_part_is_returned_once_bound() -> None:
    late = Late[list[int]]("the numbers")
    numbers = [1]
    assert late.bind(numbers) is numbers
    assert late() is numbers


def test_a_part_used_before_it_is_built_names_the_part() -> None:
    late = Late[int]("the dispatcher")
    with pytest.raises(RuntimeError, match="the dispatcher is used before"):
        late()


def test_a_part_is_bound_once() -> None:
    late = Late[int]("the outbox")
    late.bind(1)
    with pytest.raises(RuntimeError, match="the outbox is bound twice"):
        late.bind(2)
    assert late() == 1

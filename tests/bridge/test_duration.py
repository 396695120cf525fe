"""One duration formatter for progress messages and !status."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.core.duration import format_duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-1.5, "0s"),  # a clock step backwards is no negative duration
        (0.04, "0s"),
        (0.8, "0.8s"),  # "Stopped after 0.8s", not "after 0s"
        (2.3, "2.3s"),
        (3.0, "3s"),
        (5.46, "5.4s"),
        (9.99, "9.9s"),
        (10, "10s"),
        (12.7, "12s"),
        (59.99, "59s"),
        (60, "1m00s"),
        (125, "2m05s"),
        (3599.9, "59m59s"),
        (3600, "1h00m"),
        (3720, "1h02m"),
        (90000, "25h00m"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.floats(0, 10**7), st.floats(0, 10**7))
def test_longer_never_reads_shorter(a: float, b: float) -> None:
    """Rounding down keeps the order: what a ticking status shows never goes back."""
    short, long = sorted((a, b))
    rank = [_value(format_duration(short)), _value(format_duration(long))]
    assert rank[0] <= rank[1]


def _value(text: str) -> float:
    if "h" in text:
        hours, minutes = text.removesuffix("m").split("h")
        return int(hours) * 3600 + int(minutes) * 60
    if "m" in text:
        minutes, secs = text.removesuffix("s").split("m")
        return int(minutes) * 60 + int(secs)
    return float(text.removesuffix("s"))

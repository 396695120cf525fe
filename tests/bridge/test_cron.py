"""Five-field cron expressions in time zones: parsing, next firings, daylight saving."""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.automation.cron import CronError, CronExpr, local_text, utc_iso, zone_named

NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
UTC = ZoneInfo("UTC")


def at(zone: ZoneInfo, *fields: int) -> float:
    """Epoch seconds of the wall time year, month, day[, hour[, minute]] in ``zone``."""
    year, month, day, hour, minute = (*fields, 0, 0)[:5]
    return dt.datetime(year, month, day, hour, minute, tzinfo=zone).timestamp()


def take(expr: str, after: float, zone: ZoneInfo, count: int) -> list[str]:
    firings = CronExpr.parse(expr).firings(after, zone)
    return [utc_iso(next(firings)) for _ in range(count)]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("* * * *", "has 4 field(s); expected 5"),
        ("60 * * * *", "minute: 60 is not within 0-59"),
        ("* 24 * * *", "hour: 24 is not within 0-23"),
        ("* * 0 * *", "day of month: 0 is not within 1-31"),
        ("* * * 13 *", "month: 13 is not within 1-12"),
        ("* * * * 8", "day of week: 8 is not within 0-7"),
        ("*/0 * * * *", "step '0' is not a positive number"),
        ("5-1 * * * *", "range '5-1' goes backwards"),
        ("x * * * *", "minute: 'x' is not a number"),
        ("0 0 30 feb *", "names no day that exists"),
        ("0 0 31 4,6 *", "names no day that exists"),
    ],
)
def test_bad_expressions_say_why(text: str, error: str) -> None:
    with pytest.raises(CronError, match=re.escape(error)):
        CronExpr.parse(text)


def test_names_ranges_steps_and_lists() -> None:
    expr = CronExpr.parse("5/20 9-17/4 1,15 jan-mar mon-fri")
    assert expr.minutes == {5, 25, 45}
    assert expr.hours == {9, 13, 17}
    assert expr.days == {1, 15}
    assert expr.months == {1, 2, 3}
    assert expr.weekdays == {1, 2, 3, 4, 5}
    assert CronExpr.parse("0 0 * * 7").weekdays == {0}  # 7 is Sunday too


def test_either_day_field_matches_when_both_are_restricted() -> None:
    # The 13th of any month, and every Friday (as in every cron).
    after = at(UTC, 2026, 2, 1)
    days = take("0 0 13 * fri", after, UTC, 4)
    assert days == [
        "2026-02-06T00:00:00Z",  # Friday
        "2026-02-13T00:00:00Z",  # the 13th (and a Friday: once)
        "2026-02-20T00:00:00Z",
        "2026-02-27T00:00:00Z",
    ]


def test_a_weekday_job_in_a_zone() -> None:
    after = at(BERLIN, 2026, 11, 27, 10)  # a Friday, after 09:00
    assert take("0 9 * * mon-fri", after, BERLIN, 2) == [
        "2026-11-30T08:00:00Z",  # Monday 09:00 CET
        "2026-12-01T08:00:00Z",
    ]


def test_a_time_in_the_spring_gap_fires_an_hour_later_once() -> None:
    after = at(NEW_YORK, 2026, 3, 7, 12)
    firings = CronExpr.parse("30 2 * * *").firings(after, NEW_YORK)
    shown = [local_text(next(firings), NEW_YORK) for _ in range(3)]
    assert shown == ["2026-03-08 03:30 EDT", "2026-03-09 02:30 EDT", "2026-03-10 02:30 EDT"]


def test_hourly_firings_across_the_spring_gap_do_not_double() -> None:
    after = at(NEW_YORK, 2026, 3, 8, 0, 30)
    # 02:00 does not exist: it would land on 03:00, which fires once.
    assert take("0 * * * *", after, NEW_YORK, 3) == [
        "2026-03-08T06:00:00Z",  # 01:00 EST
        "2026-03-08T07:00:00Z",  # 03:00 EDT
        "2026-03-08T08:00:00Z",  # 04:00 EDT
    ]


def test_a_repeated_hour_fires_once_for_a_fixed_hour() -> None:
    after = at(NEW_YORK, 2026, 10, 31, 12)
    assert take("30 1 * * *", after, NEW_YORK, 2) == [
        "2026-11-01T05:30:00Z",  # 01:30 EDT, the first of the two
        "2026-11-02T06:30:00Z",  # 01:30 EST the next day
    ]


def test_a_repeated_hour_fires_again_when_the_hour_is_any() -> None:
    after = at(NEW_YORK, 2026, 11, 1, 0, 50)
    assert take("*/30 * * * *", after, NEW_YORK, 5) == [
        "2026-11-01T05:00:00Z",  # 01:00 EDT
        "2026-11-01T05:30:00Z",  # 01:30 EDT
        "2026-11-01T06:00:00Z",  # 01:00 EST
        "2026-11-01T06:30:00Z",  # 01:30 EST
        "2026-11-01T07:00:00Z",  # 02:00 EST
    ]


def test_zones_by_name() -> None:
    assert zone_named("Europe/Berlin") == BERLIN
    with pytest.raises(CronError, match="'Mars/Olympus' is not an IANA time zone name"):
        zone_named("Mars/Olympus")
    with pytest.raises(CronError, match="is not an IANA time zone name"):
        zone_named("../etc/passwd")


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    single = number.map(str)
    ranged = st.tuples(number, number).map(lambda p: f"{min(p)}-{max(p)}")
    stepped = st.tuples(st.sampled_from(["*", *map(str, range(low, high + 1))]), st.integers(1, 9))
    parts = st.one_of(single, ranged, stepped.map(lambda p: f"{p[0]}/{p[1]}"), st.just("*"))
    return st.lists(parts, min_size=1, max_size=3).map(",".join)


EXPRESSIONS = st.tuples(
    _field(0, 59), _field(0, 23), st.just("*"), st.just("*"), st.one_of(st.just("*"), _field(0, 6))
).map(" ".join)
INSTANTS = st.integers(int(at(UTC, 2024, 1, 1)), int(at(UTC, 2030, 1, 1))).map(float)


def _matches(expr: CronExpr, wall: dt.datetime) -> bool:
    return wall.minute in expr.minutes and wall.hour in expr.hours and expr.matches_day(wall.date())


@settings(max_examples=150, deadline=None)
@given(EXPRESSIONS, INSTANTS)
def test_in_utc_the_next_firing_is_the_first_matching_minute(text: str, after: float) -> None:
    expr = CronExpr.parse(text)
    found = expr.next_after(after, UTC)
    assert found > after
    assert found % 60 == 0
    assert _matches(expr, dt.datetime.fromtimestamp(found, UTC))
    # No matching minute in between (within a week: every such expression fires weekly).
    minute = (int(after) // 60 + 1) * 60
    while minute < found:
        assert not _matches(expr, dt.datetime.fromtimestamp(minute, UTC)), utc_iso(minute)
        minute += 60


@settings(max_examples=60, deadline=None)
@given(
    EXPRESSIONS,
    INSTANTS,
    st.sampled_from(["America/New_York", "Europe/Berlin", "Australia/Lord_Howe"]),
)
def test_in_a_zone_every_unambiguous_match_fires_and_nothing_else(
    text: str, after: float, name: str
) -> None:
    """Over two days around each instant: firings increase, each is a match (or a
    gap time moved past the jump), and every minute whose local time matches and
    happens once is among them."""
    zone, expr = ZoneInfo(name), CronExpr.parse(text)
    end = after + 2 * 86400
    firings = []
    for instant in expr.firings(after, zone):
        if instant > end:
            break
        firings.append(instant)
    assert firings == sorted(set(firings))
    for instant in firings:
        wall = dt.datetime.fromtimestamp(instant, zone)
        shifted = (
            (wall - dt.timedelta(minutes=30)).replace(tzinfo=None),
            (wall - dt.timedelta(hours=1)).replace(tzinfo=None),
        )
        assert _matches(expr, wall) or any(_matches(expr, w) for w in shifted)
    minute = (int(after) // 60 + 1) * 60
    fired = set(firings)
    while minute <= end:
        wall = dt.datetime.fromtimestamp(minute, zone)
        other = wall.replace(fold=1 - wall.fold)
        once = other.utcoffset() == wall.utcoffset()
        if once and _matches(expr, wall):
            assert minute in fired, local_text(minute, zone)
        minute += 60


def test_vixie_day_rules_leap_days_steps_ranges_and_lists() -> None:
    # Both day fields restricted: the 1st *or* a Monday (2026-06-01 is a Monday).
    assert take("0 9 1 * MON", at(UTC, 2026, 6, 1), UTC, 6) == [
        "2026-06-01T09:00:00Z",
        "2026-06-08T09:00:00Z",
        "2026-06-15T09:00:00Z",
        "2026-06-22T09:00:00Z",
        "2026-06-29T09:00:00Z",
        "2026-07-01T09:00:00Z",
    ]
    # "*" in one day field: only the other decides.
    assert take("0 0 * * 1", at(UTC, 2026, 11, 26), UTC, 2) == [
        "2026-11-30T00:00:00Z",
        "2026-12-07T00:00:00Z",
    ]
    # Feb 29 waits for the next leap year (and the one after), without looping forever.
    assert take("0 0 29 2 *", at(UTC, 2026, 3, 1), UTC, 2) == [
        "2028-02-29T00:00:00Z",
        "2032-02-29T00:00:00Z",
    ]
    # Steps, ranges, 7 as Sunday (2026-11-29 is a Sunday), lists.
    assert take("*/15 1-5 * * 7", at(UTC, 2026, 11, 26), UTC, 3) == [
        "2026-11-29T01:00:00Z",
        "2026-11-29T01:15:00Z",
        "2026-11-29T01:30:00Z",
    ]
    assert take("0 0 1,15 * 0", at(UTC, 2026, 11, 26), UTC, 4) == [
        "2026-11-29T00:00:00Z",
        "2026-12-01T00:00:00Z",
        "2026-12-06T00:00:00Z",
        "2026-12-13T00:00:00Z",
    ]

"""Five-field cron expressions, evaluated in an IANA time zone.

Fields and syntax as in docs/configuration.md (``[[schedules]]`` ``cron``; both day fields
restricted: either matching is enough). Where the local clock jumps forward a firing comes
as many minutes after the jump as it was meant after the gap's start; where it goes back, the
first occurrence only, unless the hour field is ``*`` (docs/automation.md, "Schedules").
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_MONTH_LENGTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
"""The longest each month gets (February in a leap year)."""
_SEARCH_DAYS = 366 * 8
"""How far ahead a next firing is looked for: covers a Feb 29 that must also be a given weekday's
"either" match (any restricted expression that can match at all matches within 8 years)."""
_UTC = dt.UTC


class CronError(ValueError):
    """An expression that is not a valid five-field cron expression (the message says why)."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: list[str] | None = None


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, _MONTHS),
    _Field("day of week", 0, 7, _DAYS),
)


def _number(text: str, field: _Field) -> int:
    lowered = text.lower()
    if field.names is not None and lowered in field.names:
        return field.names.index(lowered) + field.low
    if not text.isdigit():
        raise CronError(f"{field.name}: {text!r} is not a number")
    value = int(text)
    if not field.low <= value <= field.high:
        raise CronError(f"{field.name}: {value} is not within {field.low}-{field.high}")
    return value


def _parse_field(text: str, field: _Field) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{field.name}: step {step_text!r} is not a positive number")
            step = int(step_text)
        if base == "*":
            low, high = field.low, field.high
        elif "-" in base:
            first, _, last = base.partition("-")
            low, high = _number(first, field), _number(last, field)
            if low > high:
                raise CronError(f"{field.name}: range {base!r} goes backwards")
        else:
            low = _number(base, field)
            # "5/15" means from 5 to the end in steps of 15, as in Vixie cron.
            high = field.high if slash else low
        values.update(range(low, high + 1, step))
    return frozenset(values)


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed expression; :meth:`next_after` finds firings in a time zone."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 is Sunday (a 7 in the expression is folded into 0)."""
    any_day: bool
    """The day-of-month field is ``*``."""
    any_weekday: bool
    """The day-of-week field is ``*``."""
    every_hour: bool
    """The hour field is ``*``: a repeated hour (DST ending) fires again."""

    @classmethod
    def parse(cls, text: str) -> CronExpr:
        parts = text.split()
        if len(parts) != 5:
            raise CronError(
                f"{text!r} has {len(parts)} field(s); expected 5 (minute hour day month weekday)"
            )
        minute, hour, day, month, weekday = (
            _parse_field(part, field) for part, field in zip(parts, _FIELDS, strict=True)
        )
        weekday = frozenset(d % 7 for d in weekday)
        expr = cls(
            text=" ".join(parts),
            minutes=minute,
            hours=hour,
            days=day,
            months=month,
            weekdays=weekday,
            any_day=parts[2].startswith("*"),
            any_weekday=parts[4].startswith("*"),
            every_hour=parts[1] == "*",
        )
        if expr.any_weekday and not any(
            d <= _MONTH_LENGTH[m - 1] for d in expr.days for m in expr.months
        ):
            raise CronError(f"{text!r} names no day that exists in its month(s)")
        return expr

    def matches_day(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            # "*" in one day field leaves the other alone to decide.
            return in_month and in_week
        return in_month or in_week

    def next_after(self, after: float, zone: ZoneInfo) -> float:
        """The first firing strictly after ``after`` (epoch seconds), as epoch seconds."""
        for instant in self.firings(after, zone):
            return instant
        # Not reached for a parsed expression: parse() refuses one that never fires.
        raise CronError(f"{self.text!r} does not fire within {_SEARCH_DAYS} days")

    def firings(self, after: float, zone: ZoneInfo) -> Iterator[float]:
        """Every firing strictly after ``after``, in order (for at most ``_SEARCH_DAYS`` days)."""
        start = dt.datetime.fromtimestamp(after, zone).date() - dt.timedelta(days=1)
        for offset in range(_SEARCH_DAYS):
            day = start + dt.timedelta(days=offset)
            if self.matches_day(day):
                yield from (t for t in self._day_firings(day, zone) if t > after)

    def _day_firings(self, day: dt.date, zone: ZoneInfo) -> list[float]:
        instants: set[float] = set()
        for hour in self.hours:
            for minute in self.minutes:
                wall = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
                first = wall.timestamp()  # fold=0: a time in a gap maps past the jump
                instants.add(first)
                if self.every_hour:
                    second = wall.replace(fold=1).timestamp()
                    if second != first and _exists(wall.replace(fold=1), zone):
                        instants.add(second)  # the repeated hour, when the clock went back
        return sorted(instants)


def _exists(wall: dt.datetime, zone: ZoneInfo) -> bool:
    """Whether ``wall`` is a time the local clock shows (not in a forward gap)."""
    there = dt.datetime.fromtimestamp(wall.timestamp(), zone)
    return there.replace(tzinfo=None) == wall.replace(tzinfo=None)


def zone_named(name: str) -> ZoneInfo:
    """The IANA zone ``name``; :class:`CronError` if there is none by that name."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(f"{name!r} is not an IANA time zone name") from None


def utc_iso(instant: float) -> str:
    """``instant`` as ``2026-11-26T09:00:00Z``: the firing's part of its message id."""
    return dt.datetime.fromtimestamp(instant, _UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def local_text(instant: float, zone: ZoneInfo) -> str:
    """``instant`` as the zone's clock shows it, for people (``!status``)."""
    return dt.datetime.fromtimestamp(instant, zone).strftime("%Y-%m-%d %H:%M %Z")

"""Calendar periods: a day, an ISO week, a month or a year as a time zone's
calendar has it, for fixed-window counting.

A window starts at local midnight of the period's first day (the 1st of the
month, January 1st, the week's first day) and ends at the next one, so a month
is 28 to 31 days, a year 365 or 366, and a day 23 or 25 hours across a change
of daylight saving time (23.5 or 24.5 on Lord Howe Island). Where local midnight
does not exist, skipped by a change at 00:00, the period starts at the first
instant that does; where it occurs twice, at the first. The zone's rules come
from the system's time zone database through `zoneinfo`.

`Calendar.step` is the fixed window's step with these edges in place of the
epoch's: the counting is `windows.fixed_window`'s own.
"""

from __future__ import annotations

import difflib
import functools
import zoneinfo
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..primitives import ConfigurationError, Decision
from ._params import Params, State, Step
from .windows import fixed_window

__all__ = ["CALENDAR_UNITS", "WEEKDAYS", "Calendar", "calendar_unit"]

# The period of a rate, in seconds, that a calendar period stands for: a rate
# written "/month" is 30 days until a calendar says which month.
CALENDAR_UNITS = {86400: "day", 7 * 86400: "week", 30 * 86400: "month", 365 * 86400: "year"}
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def calendar_unit(period: float) -> str:
    """The calendar period of a rate's period, or a `ConfigurationError`."""
    unit: str | None = None
    if period == int(period):
        unit = CALENDAR_UNITS.get(int(period))
    if unit is None:
        raise ConfigurationError(
            "a calendar limit counts per day, week, month or year (one of each: '10000/month'),"
            f" not per {period:g} seconds"
        )
    return unit


@functools.cache
def _zones() -> tuple[str, ...]:
    return tuple(sorted(zoneinfo.available_timezones()))


def _zone(name: str) -> zoneinfo.ZoneInfo:
    if not isinstance(name, str) or not name:  # type: ignore[redundant-expr]  # files give anything
        raise ConfigurationError(
            f"a calendar's time zone is a name such as 'Europe/Berlin', got {name!r}"
        )
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        pass
    found = difflib.get_close_matches(name, _zones(), n=1, cutoff=0.6)
    guess = f"; did you mean {found[0]!r}?" if found else " (an IANA name such as 'Europe/Berlin')"
    raise ConfigurationError(f"unknown time zone {name!r}{guess}")


@dataclass(frozen=True)
class Calendar:
    """A calendar period in a time zone: ``unit`` is day, week, month or year;
    ``week_start`` the weekday a week starts on (ISO weeks: monday)."""

    tz: str
    unit: str = "month"
    week_start: str = "monday"
    zone: zoneinfo.ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.unit not in CALENDAR_UNITS.values():
            raise ConfigurationError(
                f"a calendar period is a day, week, month or year, not {self.unit!r}"
            )
        if self.week_start not in WEEKDAYS:
            found = difflib.get_close_matches(str(self.week_start).lower(), WEEKDAYS, n=1)
            guess = f"; did you mean {found[0]!r}?" if found else ""
            raise ConfigurationError(
                "week_start is a weekday's name (monday ... sunday),"
                f" got {self.week_start!r}{guess}"
            )
        object.__setattr__(self, "zone", _zone(self.tz))

    @property
    def tag(self) -> str:
        """What tells this calendar's counters from another's (the key prefix)."""
        week = f":{self.week_start}" if self.unit == "week" and self.week_start != "monday" else ""
        return f"calendar={self.tz}{week}"

    def start(self, local: datetime) -> datetime:
        """The local midnight that starts the period holding ``local``."""
        day = local.replace(hour=0, minute=0, second=0, microsecond=0, fold=0)
        if self.unit == "week":
            back = (day.weekday() - WEEKDAYS.index(self.week_start)) % 7
            return (day - timedelta(days=back)).replace(fold=0)
        if self.unit == "month":
            return day.replace(day=1)
        if self.unit == "year":
            return day.replace(month=1, day=1)
        return day

    def following(self, start: datetime) -> datetime:
        """The local midnight that starts the period after the one at ``start``."""
        if self.unit == "day":
            return start + timedelta(days=1)  # wall-clock arithmetic: midnight to midnight
        if self.unit == "week":
            return start + timedelta(days=7)
        if self.unit == "month":
            year, month = divmod(start.month, 12)  # month 12 -> the next year's January
            return start.replace(year=start.year + year, month=month + 1, day=1)
        return start.replace(year=start.year + 1, month=1, day=1)

    def window(self, now_ns: int) -> tuple[int, int]:
        """The period holding ``now_ns`` (ns since the epoch) as [start, end) in ns."""
        # periods start at whole seconds: the second holding now_ns is in the same one
        local = datetime.fromtimestamp(now_ns // 1_000_000_000, self.zone)
        start = self.start(local)
        return _ns(start), _ns(self.following(start))

    @functools.cached_property
    def step(self) -> Step:
        """The fixed window's step, its windows this calendar's periods."""
        window = self.window

        def calendar_window(
            state: State | None, now: int, cost: int, p: Params
        ) -> tuple[Decision, State]:
            if state is None or now >= state[0]:
                state = (window(now)[1], 0)
            return fixed_window(state, now, cost, p)

        return calendar_window


def _ns(moment: datetime) -> int:
    """A local moment as ns since the epoch; a local time that a change of
    daylight saving time skipped counts as the instant the change happened."""
    offset = moment.utcoffset()
    assert offset is not None
    naive = moment.replace(tzinfo=None)
    # fold=0 of a skipped time reads it with the offset before the change: the
    # instant of the change itself, the first that exists that day
    epoch = (naive - datetime(1970, 1, 1)) - offset
    return (epoch.days * 86400 + epoch.seconds) * 1_000_000_000 + epoch.microseconds * 1000

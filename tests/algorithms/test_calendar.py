"""Calendar periods against a naive model: the period holding an instant,
worked out by hand from the local date (``zoneinfo``), across month ends, 29
February and both changes of daylight saving time, in three zones (Lord Howe's
change is 30 minutes)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratewarden import ConfigurationError, FakeClock, Limiter, MemoryStore
from ratewarden.algorithms.calendar import WEEKDAYS, Calendar

ZONES = ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC")
UNITS = ("day", "week", "month", "year")
# 2023-01-01 .. 2026-12-31: three DST years each way, a leap year (2024)
INSTANTS = st.integers(1_672_531_200, 1_798_675_200)


def model(tz: str, unit: str, week_start: str, at: int) -> tuple[float, float]:
    """[start, end) in seconds, from the local calendar date alone."""
    zone = ZoneInfo(tz)
    day = datetime.fromtimestamp(at, zone).date()
    if unit == "day":
        first, after = day, day + timedelta(days=1)
    elif unit == "week":
        first = day - timedelta(days=(day.weekday() - WEEKDAYS.index(week_start)) % 7)
        after = first + timedelta(days=7)
    elif unit == "month":
        first = day.replace(day=1)
        after = (first + timedelta(days=32)).replace(day=1)
    else:
        first, after = day.replace(month=1, day=1), day.replace(year=day.year + 1, month=1, day=1)
    return midnight(first, zone), midnight(after, zone)


def midnight(day: object, zone: ZoneInfo) -> float:
    """The first instant of a local date: local 00:00, or, where a change skips
    it, the change itself (the first instant whose local date is that day)."""
    assert hasattr(day, "year")
    naive = datetime(day.year, day.month, day.day)  # type: ignore[attr-defined]
    guess = naive.replace(tzinfo=zone).timestamp()  # 00:00 read before any change
    # the earliest instant at or after midnight whose local date is the day, by the minute
    for back in range(0, 121):
        t = guess - back * 60
        if datetime.fromtimestamp(t, zone).date() != naive.date():
            return t + 60 if back else guess
    return guess


@given(
    tz=st.sampled_from(ZONES),
    unit=st.sampled_from(UNITS),
    week_start=st.sampled_from(WEEKDAYS),
    at=INSTANTS,
)
def test_the_period_holding_an_instant_is_the_calendars(
    tz: str, unit: str, week_start: str, at: int
) -> None:
    start, end = Calendar(tz, unit, week_start).window(at * 1_000_000_000)
    assert (start / 1e9, end / 1e9) == model(tz, unit, week_start, at)
    assert start <= at * 1_000_000_000 < end


EDGES = [  # (zone, unit, a local moment) around which the period must change
    ("Europe/Berlin", "month", datetime(2024, 2, 29, 23, 59, 59)),  # leap day's end
    ("Europe/Berlin", "day", datetime(2024, 3, 31, 1, 59, 59)),  # spring forward: 23 h day
    ("Europe/Berlin", "day", datetime(2024, 10, 27, 2, 30)),  # fall back: 25 h day
    ("America/New_York", "month", datetime(2023, 12, 31, 23, 59, 59)),  # a year's end
    ("Australia/Lord_Howe", "day", datetime(2024, 10, 6, 1, 59)),  # +30 min at 02:00
    ("Australia/Lord_Howe", "day", datetime(2024, 4, 7, 1, 45)),  # -30 min at 02:00
]


@pytest.mark.parametrize(("tz", "unit", "local"), EDGES)
def test_a_limit_refills_at_the_local_boundary_and_says_so(
    tz: str, unit: str, local: datetime
) -> None:
    zone = ZoneInfo(tz)
    at = local.replace(tzinfo=zone).timestamp()
    clock = FakeClock(at)
    rate = {"day": "2/day", "month": "2/month"}[unit]
    limiter = Limiter(rate, calendar=tz, store=MemoryStore(clock=clock))
    assert [limiter.hit("k").allowed for _ in range(3)] == [True, True, False]
    _, end = model(tz, unit, "monday", int(at))
    denied = limiter.hit("k")
    assert denied.retry_after == pytest.approx(end - at)  # to the local boundary
    assert denied.reset_after == pytest.approx(end - at)
    clock.set(end - 0.001)
    assert not limiter.hit("k").allowed
    clock.set(end)
    fresh = limiter.hit("k")
    assert fresh.allowed
    _, following = model(tz, unit, "monday", int(end))
    assert fresh.reset_after == pytest.approx(following - end)  # the next period's real length


def test_a_day_across_a_change_of_daylight_saving_time_lasts_23_or_25_hours() -> None:
    berlin = Calendar("Europe/Berlin", "day")
    spring = datetime(2024, 3, 31, 12, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()
    fall = datetime(2024, 10, 27, 12, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()
    for at, hours in ((spring, 23), (fall, 25)):
        start, end = berlin.window(int(at * 1e9))
        assert (end - start) / 3.6e12 == hours
    howe = Calendar("Australia/Lord_Howe", "day")
    at = datetime(2024, 10, 6, 12, tzinfo=ZoneInfo("Australia/Lord_Howe")).timestamp()
    start, end = howe.window(int(at * 1e9))
    assert (end - start) / 3.6e12 == 23.5


def test_weeks_are_iso_unless_week_start_says_otherwise() -> None:
    wednesday = datetime(2024, 5, 15, 12, tzinfo=UTC).timestamp() * 1e9
    start, _ = Calendar("UTC", "week").window(int(wednesday))
    assert datetime.fromtimestamp(start / 1e9, UTC).strftime("%A %d") == "Monday 13"
    start, _ = Calendar("UTC", "week", "sunday").window(int(wednesday))
    assert datetime.fromtimestamp(start / 1e9, UTC).strftime("%A %d") == "Sunday 12"


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"calendar": "Europe/Berln"},
         "unknown time zone 'Europe/Berln'; did you mean 'Europe/Berlin'?"),
        ({"calendar": "Nowhere"}, "unknown time zone 'Nowhere'"),
        ({"calendar": "UTC", "week_start": "mon"}, "did you mean 'monday'?"),
        ({"calendar": "UTC", "algorithm": "gcra"},
         "counts in fixed windows (its periods), not gcra"),
        ({"calendar": "UTC", "shards": 4}, "no adaptive, two_tier or shards"),
        ({"week_start": "sunday"}, "week_start goes with a calendar"),
    ],
)  # fmt: skip
def test_a_bad_calendar_is_said_clearly(kwargs: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigurationError, match=None) as raised:
        Limiter("10/month", **kwargs)  # type: ignore[arg-type]
    assert said in str(raised.value)


def test_a_period_that_is_no_calendars_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="per day, week, month or year"):
        Limiter("10/hour", calendar="UTC")
    with pytest.raises(ConfigurationError, match="per day, week, month or year"):
        Limiter("10/2days", calendar="UTC")


def test_calendar_and_plain_counters_never_meet() -> None:
    store = MemoryStore(clock=FakeClock(1_700_000_000))
    plain = Limiter("1/month", algorithm="fixed_window", store=store)
    berlin = Limiter("1/month", calendar="Europe/Berlin", store=store)
    tokyo = Limiter("1/month", calendar="Asia/Tokyo", store=store)
    assert [plain.hit("k").allowed, berlin.hit("k").allowed, tokyo.hit("k").allowed] == [True] * 3


def test_a_store_that_counts_no_calendars_refuses_one_rather_than_count_30_days() -> None:
    class Epochs(MemoryStore):
        calendars = False  # a store whose fixed windows are the epoch's

    with pytest.raises(ConfigurationError, match="does not count calendar periods"):
        Limiter("10/month", calendar="Europe/Berlin", store=Epochs())
    with pytest.raises(ConfigurationError, match="no adaptive, two_tier or shards"):
        Limiter("10/month", calendar="Europe/Berlin", two_tier=True)

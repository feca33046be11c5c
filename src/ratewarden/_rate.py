from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ._errors import ConfigurationError

__all__ = ["Rate", "parse_rate"]

# Seconds per unit; envoy configurations (envoy/_tree.py) use the same table.
UNIT_SECONDS = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86400,
    "week": 7 * 86400,
    "month": 30 * 86400,
    "year": 365 * 86400,
}
_ALIASES = {
    "s": "second", "sec": "second", "secs": "second", "second": "second", "seconds": "second",
    "m": "minute", "min": "minute", "mins": "minute", "minute": "minute", "minutes": "minute",
    "h": "hour", "hr": "hour", "hrs": "hour", "hour": "hour", "hours": "hour",
    "d": "day", "day": "day", "days": "day",
    "w": "week", "wk": "week", "week": "week", "weeks": "week",
    "mo": "month", "month": "month", "months": "month",
    "y": "year", "yr": "year", "year": "year", "years": "year",
}  # fmt: skip

# "<limit> ('/' | 'per') [<count>] <unit>", e.g. "100/minute", "10 per second", "5/2hours".
_RATE = re.compile(
    r"^\s*(?P<limit>\S+?)\s*(?:/|\s+per\s+)\s*(?P<count>\d+(?:\.\d+)?)?\s*(?P<unit>[A-Za-z]+)\s*$",
    re.ASCII,  # 0-9 only: "\u00b2" passes isdigit() but fails int(); no Arabic-Indic digits
)


@dataclass(frozen=True, slots=True)
class Rate:
    """``limit`` requests (or cost units) per ``period`` seconds.

    >>> Rate(100, 60)
    Rate(limit=100, period=60)
    >>> Rate.parse("5/2hours").period
    7200
    """

    limit: int
    period: float

    def __post_init__(self) -> None:
        if type(self.limit) is not int or self.limit < 1:
            raise ConfigurationError(f"rate limit must be a positive integer, got {self.limit!r}")
        if isinstance(self.period, bool) or not isinstance(self.period, int | float):
            raise ConfigurationError(f"rate period must be seconds, got {self.period!r}")
        if not (math.isfinite(self.period) and self.period > 0):
            raise ConfigurationError(f"rate period must be finite and > 0, got {self.period!r}")
        if self.period_ns < 1:
            raise ConfigurationError(f"rate period {self.period!r}s is shorter than a nanosecond")

    @property
    def period_ns(self) -> int:
        """The period in integer nanoseconds, the unit the algorithms count in."""
        if isinstance(self.period, int):
            return self.period * 1_000_000_000
        return round(self.period * 1e9)

    @classmethod
    def parse(cls, text: str | Rate) -> Rate:
        """Parse ``"100/minute"``, ``"10 per second"``, ``"5/2hours"``, ``"1000/day"``."""
        return parse_rate(text)

    def __str__(self) -> str:
        for unit, seconds in reversed(UNIT_SECONDS.items()):
            if self.period % seconds == 0:
                count = int(self.period // seconds)
                return f"{self.limit}/{unit}" if count == 1 else f"{self.limit}/{count}{unit}s"
        return f"{self.limit}/{self.period}seconds"


def parse_rate(text: str | Rate) -> Rate:
    """Turn a rate string into a `Rate`; a `Rate` passes through unchanged.

    Raises `ConfigurationError` naming the part that is wrong.
    """
    if isinstance(text, Rate):
        return text
    if not isinstance(text, str):
        raise ConfigurationError(
            f"a rate is a string like '100/minute' or a Rate, got {type(text).__name__}"
        )
    match = _RATE.match(text)
    if match is None:
        raise ConfigurationError(
            f"cannot parse rate {text!r}: expected '<limit>/<unit>' or"
            " '<limit> per <count> <unit>', e.g. '100/minute', '10 per second', '5/2hours'"
        )
    raw_limit, raw_count, raw_unit = match["limit"], match["count"], match["unit"]
    if not (raw_limit.isascii() and raw_limit.isdigit()) or int(raw_limit) < 1:
        raise ConfigurationError(f"bad limit {raw_limit!r} in rate {text!r}: a positive integer")
    unit = _ALIASES.get(raw_unit.lower())
    if unit is None:
        known = ", ".join(UNIT_SECONDS)
        raise ConfigurationError(f"unknown unit {raw_unit!r} in rate {text!r}: use one of {known}")
    count: float = 1
    if raw_count is not None:
        count = float(raw_count) if "." in raw_count else int(raw_count)
        if count <= 0:
            raise ConfigurationError(
                f"bad period count {raw_count!r} in rate {text!r}: must be > 0"
            )
    period = count * UNIT_SECONDS[unit]
    return Rate(int(raw_limit), int(period) if float(period).is_integer() else period)

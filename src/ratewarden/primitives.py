"""What every layer of the package builds on, for its subpackages: clocks, a
limit's `Decision`, the errors, rates, and the flows that let one piece of
logic serve a blocking and an asyncio caller. The modules that define them are
the root's own; the stores, the algorithms and the packages above import them
from here.
"""

from ._clock import Clock, FakeClock, SystemClock
from ._decision import Decision
from ._errors import (
    ConfigurationError,
    RateLimitTimeout,
    RatewardenError,
    StoreError,
    StoreUnavailable,
)
from ._flow import Call, Flow, adrive, drive
from ._rate import UNIT_SECONDS, Rate, parse_rate

__all__ = [
    "UNIT_SECONDS",
    "Call",
    "Clock",
    "ConfigurationError",
    "Decision",
    "FakeClock",
    "Flow",
    "Rate",
    "RateLimitTimeout",
    "RatewardenError",
    "StoreError",
    "StoreUnavailable",
    "SystemClock",
    "adrive",
    "drive",
    "parse_rate",
]

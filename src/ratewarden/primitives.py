"""What every layer of the package builds on, for its subpackages: clocks, a
limit's `Decision`, the errors, rates, and the flows that let one piece of
logic serve a blocking and an asyncio caller. The modules that define them are
the root's own; the stores, the algorithms and the packages above import them
from here.
"""

from ._clock import (
    Clock,
    FakeClock,
    SystemClock,
    TestSwitch,
    default_clock,
    install_test_switch,
    test_switch,
)
from ._decision import Decision
from ._errors import (
    ConfigurationError,
    LeaseNotHeld,
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
    "LeaseNotHeld",
    "Rate",
    "RateLimitTimeout",
    "RatewardenError",
    "StoreError",
    "StoreUnavailable",
    "SystemClock",
    "TestSwitch",
    "adrive",
    "default_clock",
    "drive",
    "install_test_switch",
    "parse_rate",
    "test_switch",
]

"""ratewarden: exact, fast rate limiting for Python, on one process or a fleet."""

from ._clock import Clock, FakeClock, SystemClock
from ._decision import Decision
from ._errors import (
    ConfigurationError,
    RateLimitTimeout,
    RatewardenError,
    StoreError,
    StoreUnavailable,
)
from ._limiter import AsyncLimiter, Limiter, ahit_many, hit_many
from ._rate import Rate, parse_rate
from .algorithms import ALGORITHMS
from .stores import AsyncMemoryStore, AsyncStore, MemoryStore, Store

__all__ = [
    "ALGORITHMS",
    "AsyncLimiter",
    "AsyncMemoryStore",
    "AsyncStore",
    "Clock",
    "ConfigurationError",
    "Decision",
    "FakeClock",
    "Limiter",
    "MemoryStore",
    "Rate",
    "RateLimitTimeout",
    "RatewardenError",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "SystemClock",
    "ahit_many",
    "hit_many",
    "parse_rate",
]
__version__ = "0.1.0"

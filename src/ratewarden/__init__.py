"""ratewarden: exact, fast rate limiting for Python, on one process or a fleet."""

from ._aconcurrency import AsyncConcurrencyLimiter, AsyncHold
from ._adaptive import Adaptive
from ._clock import Clock, FakeClock, SystemClock
from ._concurrency import ConcurrencyLimiter, Hold
from ._concurrency_core import ConcurrencyStats
from ._decision import Decision
from ._errors import (
    ConfigurationError,
    LeaseNotHeld,
    RateLimitTimeout,
    RatewardenError,
    StoreError,
    StoreUnavailable,
)
from ._hitmany import ahit_many, hit_many
from ._limiter import AsyncLimiter, Limiter
from ._queue import AsyncPacedQueue, PacedQueue, QueueFull
from ._rate import Rate, parse_rate
from ._reservation import AsyncReservation, Estimates, Reservation, ReservationError
from .algorithms import ALGORITHMS
from .stores import AsyncMemoryStore, AsyncStore, MemoryStore, Store

__all__ = [
    "ALGORITHMS",
    "Adaptive",
    "AsyncConcurrencyLimiter",
    "AsyncHold",
    "AsyncLimiter",
    "AsyncMemoryStore",
    "AsyncPacedQueue",
    "AsyncReservation",
    "AsyncStore",
    "Clock",
    "ConcurrencyLimiter",
    "ConcurrencyStats",
    "ConfigurationError",
    "Decision",
    "Estimates",
    "FakeClock",
    "Hold",
    "LeaseNotHeld",
    "Limiter",
    "MemoryStore",
    "PacedQueue",
    "QueueFull",
    "Rate",
    "RateLimitTimeout",
    "RatewardenError",
    "Reservation",
    "ReservationError",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "SystemClock",
    "ahit_many",
    "hit_many",
    "parse_rate",
]


def __getattr__(name: str) -> str:
    """``__version__``, read from the installed package's metadata on first use, so
    that pyproject.toml alone says it and importing ratewarden stays light."""
    if name == "__version__":
        from importlib.metadata import version  # noqa: PLC0415

        return version("ratewarden")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The limiter kernel, for the packages built on it (rules, fleet, envoy, the
integrations, the service): limiters and their options, one request checked
against several limits in one store call, the lines of waiting callers, the
rate-limit headers, adaptive limits, concurrency limits and reservations. The
modules that define them are the root's own; the packages above import them
from here.
"""

from ._aconcurrency import AsyncConcurrencyLimiter
from ._adaptive import UNITS, Adaptive, Load, LoadSignals, parse_floor
from ._headers import Policy, policy_item, rate_limit_fields, rate_limit_headers
from ._hitmany import ahit_many, ahit_tiers, hit_many, hit_tiers
from ._limiter import AsyncLimiter, Limiter, LimiterOptions
from ._reservation import AsyncReservation, Reservation, ReservationError
from ._waiting import AsyncTurns, Turns, check_max_wait, check_priority

__all__ = [
    "UNITS",
    "Adaptive",
    "AsyncConcurrencyLimiter",
    "AsyncLimiter",
    "AsyncReservation",
    "AsyncTurns",
    "Limiter",
    "LimiterOptions",
    "Load",
    "LoadSignals",
    "Policy",
    "Reservation",
    "ReservationError",
    "Turns",
    "ahit_many",
    "ahit_tiers",
    "check_max_wait",
    "check_priority",
    "hit_many",
    "hit_tiers",
    "parse_floor",
    "policy_item",
    "rate_limit_fields",
    "rate_limit_headers",
]

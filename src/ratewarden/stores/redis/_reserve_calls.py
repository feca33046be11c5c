"""A reservation's calls as the Redis scripts take them, without I/O: one limit's
arguments and replies (`Plan`), shared by `_areserver` (written) and `_reserver`
(generated from it)."""

from __future__ import annotations

from typing import Any

from ...primitives import ConfigurationError, Decision, StoreError
from ..base import check_cost
from ._script_calls import Limit
from .scripts import RESERVE

__all__ = ["Plan", "redis_limit"]


def redis_limit(tier: Any, store: object) -> Limit:
    """The Redis limit of a `Bound`'s ``tier``, or why it cannot reserve."""
    if not isinstance(tier, Limit):
        raise ConfigurationError(
            f"reservations count in Redis one call at a time: not with two_tier on {store!r}"
        )
    if tier.calendar is not None:  # its periods move with the clocks: _reserve.lua's do not
        raise ConfigurationError(
            "a calendar limit reserves on the memory store; on Redis, hit it once the cost"
            " is known (reserve-then-settle of calendar periods is not on Redis)"
        )
    return tier


class Plan:
    """One limit's reservation calls: arguments and replies."""

    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self.script = RESERVE + limit.script
        # Every settle clamps what it applies to twice the limit's size (what a
        # window or a bucket in debt can hold): larger deltas give the same state,
        # and Lua counts exactly only below 2^53.
        self.bound = 2 * limit.size

    def now(self) -> Any:
        clock = self.limit.test_clock
        return "" if clock is None else clock.time_ns() // 1000

    def reserve_args(self, key: str, cost: int) -> list[Any] | Decision:
        check_cost(cost)
        limit = self.limit
        if limit.breaker.failures and (blocked := limit.blocked(key, cost, "hit")) is not None:
            return blocked
        return [limit.prefix + key, self.now(), "reserve", min(cost, 2**53), limit.packed]

    def reserved(self, reply: list[int]) -> tuple[Decision, int]:
        *answer, mark = reply
        return self.limit.answer(answer), mark

    def failed(self, error: StoreError, key: str, cost: int) -> tuple[Decision, int]:
        return self.limit.failed(error, key, cost), 0

    def settle_args(self, key: str, delta: int, mark: int, estimate: int) -> list[Any]:
        bound = self.bound
        delta, estimate = max(min(delta, bound), -bound), min(estimate, bound)
        limit = self.limit
        return [limit.prefix + key, self.now(), "settle", delta, limit.packed, mark, estimate]

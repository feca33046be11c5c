"""Reservations on Redis (see `ratewarden.stores.reservations`): a reserve and a
settle are one call each of the algorithm's reservation script (``_reserve.lua``
after ``_settle.lua``), which mirrors `ratewarden.algorithms.settle`.

`Plan` works out the arguments and reads the replies, without I/O; `RedisReserver`
and `AsyncRedisReserver` only make the calls.
"""

from __future__ import annotations

from typing import Any

from ...primitives import ConfigurationError, Decision, StoreError
from ..base import check_cost
from ._script_calls import Limit
from .scripts import RESERVE

__all__ = ["AsyncRedisReserver", "Plan", "RedisReserver", "redis_limit"]


def redis_limit(tier: Any, store: object) -> Limit:
    """The Redis limit of a `Bound`'s ``tier``, or why it cannot reserve."""
    if not isinstance(tier, Limit):
        raise ConfigurationError(
            f"reservations count in Redis one call at a time: not with two_tier on {store!r}"
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


class RedisReserver:
    """Reservations on a sync Redis store: one script call each."""

    def __init__(self, store: Any, limit: Limit) -> None:
        self.plan, self.call = Plan(limit), store.scripts.call

    def reserve(self, key: str, cost: int) -> tuple[Decision, int]:
        plan = self.plan
        args = plan.reserve_args(key, cost)
        if isinstance(args, Decision):
            return args, 0
        try:
            return plan.reserved(self.call(plan.script, 1, args))
        except StoreError as exc:
            return plan.failed(exc, key, cost)

    def settle(self, key: str, delta: int, mark: int, estimate: int) -> None:
        plan = self.plan
        self.call(plan.script, 1, plan.settle_args(key, delta, mark, estimate))


class AsyncRedisReserver:
    """Reservations on an asyncio Redis store, through its batcher."""

    def __init__(self, store: Any, limit: Limit) -> None:
        self.plan, self.call = Plan(limit), store._batcher.submit

    async def reserve(self, key: str, cost: int) -> tuple[Decision, int]:
        plan = self.plan
        args = plan.reserve_args(key, cost)
        if isinstance(args, Decision):
            return args, 0
        try:
            return plan.reserved(await self.call(plan.script, 1, args))
        except StoreError as exc:
            return plan.failed(exc, key, cost)

    async def settle(self, key: str, delta: int, mark: int, estimate: int) -> None:
        plan = self.plan
        await self.call(plan.script, 1, plan.settle_args(key, delta, mark, estimate))

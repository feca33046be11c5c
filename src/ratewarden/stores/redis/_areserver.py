"""A limit's reservations on a Redis store: one script call each (on the asyncio
store, through its batcher). `_reserver` is generated from `_areserver`."""

# unasync: twin _reserver.py
# unasync: rename store._batcher.submit -> store.scripts.call

from __future__ import annotations

from typing import Any

from ...primitives import Decision, StoreError
from ._reserve_calls import Plan
from ._script_calls import Limit

__all__ = ["AsyncRedisReserver"]


class AsyncRedisReserver:
    """A limit's reservations in a Redis store (see `ratewarden.stores.reservations`)."""

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

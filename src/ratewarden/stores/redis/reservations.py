"""Reservations on Redis (see `ratewarden.stores.reservations`): a reserve and a
settle are one call each of the algorithm's reservation script (``_reserve.lua``
after ``_settle.lua``), which mirrors `ratewarden.algorithms.settle`. What the
calls send and what the replies mean is `_reserve_calls`'s; `_areserver` makes
them on the asyncio store, `_reserver` (generated from it) on the sync one.
"""

from __future__ import annotations

from ._areserver import AsyncRedisReserver
from ._reserve_calls import Plan, redis_limit
from ._reserver import RedisReserver

__all__ = ["AsyncRedisReserver", "Plan", "RedisReserver", "redis_limit"]

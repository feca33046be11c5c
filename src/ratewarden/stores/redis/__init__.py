"""The Redis store (``pip install ratewarden[redis]``): every algorithm as a Lua
script (``lua/``, package data), one round trip per check, on Redis, Redis
Cluster, Sentinel or Valkey; two-tier counting for hot limits.

Its neighbours may import `connection` (a Redis URL turned into a client) and
`scripts` (the Lua scripts loaded by SHA); the rest of this package is its own.
"""

from ._aleases import AsyncRedisLeases
from ._astore import AsyncRedisStore
from ._leases import RedisLeases
from ._script_calls import ClockSkew
from ._store import RedisStore
from ._twotier import TwoTierSettings

__all__ = [
    "AsyncRedisLeases", "AsyncRedisStore", "ClockSkew", "RedisLeases", "RedisStore",
    "TwoTierSettings",
]  # fmt: skip

"""Where limits keep their counts: `MemoryStore` here, the Redis stores in
`ratewarden.stores.redis`, and the protocol a store of your own implements
(`Store` / `AsyncStore`, documented in `ratewarden.stores.base` and
docs/stores.md): what ``bind``, ``hit_many``, ``hit_tiers`` and ``close`` take
and return, and the helpers every store shares."""

from .base import (
    Answers,
    AsyncBound,
    AsyncHitFn,
    AsyncResetFn,
    AsyncStore,
    BindOptions,
    Bound,
    Check,
    HitFn,
    OnFailure,
    ResetFn,
    Store,
    check_cost,
    pick,
)
from .failure import fallback
from .memory import AsyncMemoryStore, MemoryStore

__all__ = [
    "Answers",
    "AsyncBound",
    "AsyncHitFn",
    "AsyncMemoryStore",
    "AsyncResetFn",
    "AsyncStore",
    "BindOptions",
    "Bound",
    "Check",
    "HitFn",
    "MemoryStore",
    "OnFailure",
    "ResetFn",
    "Store",
    "check_cost",
    "fallback",
    "pick",
]

"""`hit_many` and `hit_tiers`: one request checked against several limits in one
store call, admitted only if all pass, and then counted in all."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from ._adaptive import in_requests
from ._decision import Decision
from ._errors import ConfigurationError
from ._limiter import AsyncLimiter, Limiter
from .stores import shards as _shards
from .stores.base import Check

__all__ = ["ahit_many", "ahit_tiers", "hit_many", "hit_tiers"]

_L = TypeVar("_L", Limiter, AsyncLimiter)
_LIMITERS = (Limiter, AsyncLimiter)  # a tuple: isinstance takes it faster than a union


# An adaptive tier's price, by what its Decision says: its name and its limit in units
Prices = dict[tuple[str | None, int], int]


def _checks(
    checks: Iterable[tuple[_L, str] | tuple[_L, str, int]],
) -> tuple[Any, list[Check], bool, Prices | None]:
    """The store every tier shares, the tiers as that store takes them, whether
    any is sharded (then `_shards` drives the store), and the prices of the
    adaptive tiers (None: there are none)."""
    store: Any = None
    sharded = False
    tiers: list[Check] = []
    prices: Prices | None = None
    for check in checks:
        if not isinstance(check, tuple) or len(check) not in (2, 3):  # type: ignore[redundant-expr]
            raise ConfigurationError(
                f"a check is (limiter, key) or (limiter, key, cost), got {check!r}"
            )
        limiter = check[0]
        if not isinstance(limiter, _LIMITERS):
            raise ConfigurationError(f"a check starts with a limiter, got {limiter!r}")
        if store is None:
            store = limiter.store
        elif limiter.store is not store:
            raise ConfigurationError(
                "hit_many needs every limiter on one store: it counts all tiers atomically"
            )
        cost = check[2] if len(check) == 3 else 1
        direct = limiter.direct
        if direct is not None:  # the store takes it as it is: no Tier made per check
            tiers.append((direct, check[1], cost))
            continue
        tier = limiter.tier(check[1], cost)
        if tier.price is not None:
            prices = {} if prices is None else prices
            prices.update(((limiter.name, limit), tier.price) for limit in tier.limits)
        tiers.append(tier.check)
        sharded = sharded or tier.sharded
    if store is None:
        raise ConfigurationError("hit_many needs at least one (limiter, key) to check")
    return store, tiers, sharded, prices


def _told(decision: Decision | None, prices: Prices | None) -> Decision | None:
    """``decision`` in requests, if an adaptive tier gave it (its rule and its
    limit in units say which); as it is otherwise."""
    if prices is None or decision is None:
        return decision
    price = prices.get((decision.rule, decision.limit))
    return decision if price is None else in_requests(decision, price)


def _both_told(
    told: tuple[Decision | None, Decision | None], prices: Prices | None
) -> tuple[Decision | None, Decision | None]:
    """`_told` of the enforced and the shadow side of a `hit_tiers`."""
    return told if prices is None else (_told(told[0], prices), _told(told[1], prices))


def hit_many(checks: Iterable[tuple[Limiter, str] | tuple[Limiter, str, int]]) -> Decision:
    """Check one request against several limits at once: ``(limiter, key)`` or
    ``(limiter, key, cost)`` each, every limiter on one store.

    The request is admitted only if every tier passes, and then counted in all of
    them; a denied request is counted nowhere. The memory store does this under one
    lock, the Redis store in one script call (keys in one cluster slot; see
    `RedisStore` for tiers that span slots).

    Returns one Decision: if denied, the denying tier's with the longest
    retry_after (its ``rule`` names it: give your limiters names); if allowed, that
    of the tier with the least room left relative to its size.
    """
    store, tiers, sharded, prices = _checks(checks)
    decision: Decision = _shards.hit_many(store, tiers) if sharded else store.hit_many(tiers)
    return decision if prices is None else _told(decision, prices)  # type: ignore[return-value]


async def ahit_many(
    checks: Iterable[tuple[AsyncLimiter, str] | tuple[AsyncLimiter, str, int]],
) -> Decision:
    """The asyncio twin of `hit_many`, for `AsyncLimiter` tiers."""
    store, tiers, sharded, prices = _checks(checks)
    if sharded:
        decision: Decision = await _shards.ahit_many(store, tiers)
    else:
        decision = await store.hit_many(tiers)
    return decision if prices is None else _told(decision, prices)  # type: ignore[return-value]


def _tiers(
    checks: Sequence[tuple[_L, str, int]], shadow: Sequence[tuple[_L, str, int]]
) -> tuple[Any, list[Check], list[Check], bool, Prices | None]:
    store, tiers, sharded, prices = _checks(checks) if checks else (None, [], False, None)
    shadow_store, shadow_tiers, shadow_sharded, shadow_prices = (
        _checks(shadow) if shadow else (store, [], False, None)
    )
    if shadow_prices is not None:
        prices = shadow_prices if prices is None else prices | shadow_prices
    if store is None:
        store = shadow_store
    elif shadow_store is not store:
        raise ConfigurationError("hit_tiers needs every limiter on one store")
    if store is None:
        raise ConfigurationError("hit_tiers needs at least one (limiter, key) to check")
    return store, tiers, shadow_tiers, sharded or shadow_sharded, prices


def hit_tiers(
    checks: Sequence[tuple[Limiter, str, int]], shadow: Sequence[tuple[Limiter, str, int]]
) -> tuple[Decision | None, Decision | None]:
    """For the rule engine: `hit_many` of ``checks`` and, if it admitted the request
    (or there were none), of the ``shadow`` tiers that never deny, in one store
    call. Their Decisions; None for a side not checked."""
    store, tiers, shadow_tiers, sharded, prices = _tiers(checks, shadow)
    if sharded:
        told = _shards.hit_tiers(store, tiers, shadow_tiers)
    else:
        told = store.hit_tiers(tiers, shadow_tiers)
    return _both_told(told, prices)


async def ahit_tiers(
    checks: Sequence[tuple[AsyncLimiter, str, int]],
    shadow: Sequence[tuple[AsyncLimiter, str, int]],
) -> tuple[Decision | None, Decision | None]:
    """The asyncio twin of `hit_tiers`."""
    store, tiers, shadow_tiers, sharded, prices = _tiers(checks, shadow)
    if sharded:
        told = await _shards.ahit_tiers(store, tiers, shadow_tiers)
    else:
        told = await store.hit_tiers(tiers, shadow_tiers)
    return _both_told(told, prices)

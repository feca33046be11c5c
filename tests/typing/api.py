"""The public API's types, checked by mypy and never run (pytest collects no
``api.py``). Each ``assert_type`` pins what a caller's type checker sees; each
``type: ignore[arg-type]`` marks a misuse that must stay a type error: with
``warn_unused_ignores`` mypy fails as soon as one of them type-checks."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import assert_type

from ratewarden import (
    AsyncConcurrencyLimiter,
    AsyncHold,
    AsyncLimiter,
    AsyncMemoryStore,
    AsyncReservation,
    ConcurrencyLimiter,
    Decision,
    Estimates,
    FakeClock,
    Hold,
    Limiter,
    MemoryStore,
    Reservation,
    ahit_many,
    hit_many,
)
from ratewarden.rules import AsyncRuleEngine, Outcome, RuleEngine
from ratewarden.stores import Answers, AsyncStore, Store
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.stores.test_custom_store import AsyncDictStore, DictStore


def sync_api() -> None:
    limiter = Limiter("10/second", store=MemoryStore())
    assert_type(limiter.hit("k"), Decision)
    assert_type(limiter.hit("k", 2), Decision)
    assert_type(limiter.peek("k"), Decision)
    assert_type(limiter.reset("k"), None)
    assert_type(limiter.acquire("k", max_wait=1.0), Decision)
    assert_type(limiter.hit("k").allowed, bool)
    assert_type(limiter.hit("k").retry_after, float)
    assert_type(hit_many([(limiter, "a"), (limiter, "b", 2)]), Decision)


async def async_api() -> None:
    limiter = AsyncLimiter("10/second", store=AsyncMemoryStore())
    assert_type(limiter.hit("k"), Awaitable[Decision])
    assert_type(await limiter.hit("k"), Decision)
    assert_type(await limiter.peek("k"), Decision)
    assert_type(await limiter.acquire("k", max_wait=1.0), Decision)
    assert_type(await ahit_many([(limiter, "a"), (limiter, "b", 2)]), Decision)


def redis_stores() -> None:
    store = RedisStore("redis://localhost:6379/0")
    assert_type(store, RedisStore)
    assert_type(Limiter("10/second", store=store).hit("k"), Decision)
    astore = AsyncRedisStore("redis://localhost:6379/0")
    assert_type(astore, AsyncRedisStore)
    assert_type(AsyncLimiter("10/second", store=astore).hit("k"), Awaitable[Decision])


async def rule_engines() -> None:
    assert_type(RuleEngine("rules.yaml", MemoryStore()).check({"user": "u"}), Outcome)
    engine = AsyncRuleEngine("rules.yaml", AsyncMemoryStore())
    assert_type(await engine.acheck({"user": "u"}), Outcome)


async def custom_stores() -> None:
    """Stores written from the public API alone (tests/stores/test_custom_store.py)
    are a `Store` and an `AsyncStore`, and every front takes them."""
    clock = FakeClock()
    store: Store = DictStore(clock)
    astore: AsyncStore = AsyncDictStore(clock)
    assert_type(store.hit_tiers([], []), Answers)
    assert_type(Limiter("10/second", store=DictStore(clock)).hit("k"), Decision)
    assert_type(AsyncLimiter("10/second", store=astore).hit("k"), Awaitable[Decision])
    assert_type(RuleEngine("rules.yaml", store).check({"user": "u"}), Outcome)
    assert_type(await AsyncRuleEngine("rules.yaml", astore).acheck({"user": "u"}), Outcome)


def a_limiter_and_a_store_of_the_other_kind() -> None:
    """A sync limiter cannot take an async store, nor the reverse."""
    Limiter("10/second", store=AsyncMemoryStore())  # type: ignore[arg-type]
    AsyncLimiter("10/second", store=MemoryStore())  # type: ignore[arg-type]
    Limiter("10/second", store=AsyncRedisStore("redis://localhost"))  # type: ignore[arg-type]
    AsyncLimiter("10/second", store=RedisStore("redis://localhost"))  # type: ignore[arg-type]
    Limiter("10/second", store=AsyncDictStore(FakeClock()))  # type: ignore[arg-type]
    AsyncLimiter("10/second", store=DictStore(FakeClock()))  # type: ignore[arg-type]
    RuleEngine("rules.yaml", AsyncDictStore(FakeClock()))  # type: ignore[arg-type]


def concurrency_api() -> None:
    limiter = ConcurrencyLimiter(4, store=RedisStore("redis://localhost:6379/0"), lease=10.0)
    ConcurrencyLimiter(4, store=MemoryStore())
    with limiter.hold("k", max_wait=1.0) as hold:
        assert_type(hold, Hold)
        assert_type(hold.lease_id, str)
    assert_type(limiter.in_flight("k"), int)
    ConcurrencyLimiter(4, store=AsyncRedisStore("redis://x"))  # type: ignore[arg-type]
    ConcurrencyLimiter(4, store=AsyncMemoryStore())  # type: ignore[arg-type]


async def async_concurrency_api() -> None:
    limiter = AsyncConcurrencyLimiter(4, store=AsyncRedisStore("redis://localhost:6379/0"))
    AsyncConcurrencyLimiter(4, store=AsyncMemoryStore())
    async with limiter.hold("k") as hold:
        assert_type(hold, AsyncHold)
    assert_type(await limiter.in_flight("k"), int)
    AsyncConcurrencyLimiter(4, store=MemoryStore())  # type: ignore[arg-type]


async def reservations() -> None:
    limiter = Limiter("10/second", store=MemoryStore(), estimates=Estimates(ceiling=5))
    reserved = limiter.reserve("k", cost=3)
    assert_type(reserved, Reservation)
    assert_type(reserved.settle(2), None)
    assert_type(reserved.cancel(), None)
    assert_type(limiter.reserve("k", profile="chat").decision, Decision)
    alimiter = AsyncLimiter("10/second", store=AsyncMemoryStore())
    areserved = await alimiter.reserve("k", cost=3)
    assert_type(areserved, AsyncReservation)
    assert_type(await areserved.settle(2), None)
    assert_type(await areserved.cancel(), None)
    limiter.reserve("k", cost="3")  # type: ignore[arg-type]

"""`RuleEngine.reset` and `AsyncRuleEngine.areset` forget a key in the limits
the checks count in: an override's limit, an adaptive limit's, a sharded one's
(in memory and on Redis) and, on Redis, a two-tier one's, where a fresh limiter
built from the rule file would forget a key nobody counts. Each kind of limit
is tried on both engines: their resets share the choice of limiters, not the
calls."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import pytest

from ratewarden import AsyncMemoryStore, FakeClock, MemoryStore
from ratewarden.rules import AsyncRuleEngine, RuleEngine, UnknownRule, loads
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.redis_server import LIVE, RedisServer

START = 1_700_000_040.0


def rules(extra: str) -> str:
    return f"rules:\n  - {{name: api, rate: 3/minute, algorithm: fixed_window, by: user{extra}}}\n"


def allowed(check: Callable[[], bool], times: int) -> list[bool]:
    return [check() for _ in range(times)]


def engine_for(extra: str) -> RuleEngine:
    return RuleEngine(loads(rules(extra)), MemoryStore(clock=FakeClock(START)))


def test_an_override_s_count_is_forgotten() -> None:
    engine = engine_for("")
    engine.set_override("api", "2/minute", duration="10m", reason="a test")
    assert allowed(lambda: engine.check({"user": "bob"}).allowed, 3) == [True, True, False]
    assert engine.reset("bob") == 1
    assert engine.check({"user": "bob"}).allowed


def test_an_adaptive_limit_s_count_is_forgotten() -> None:
    engine = engine_for(", adaptive: {signal: load, good: 1, bad: 2, floor: 1%}")
    engine.set_load("load", 2.0)  # as small as it goes: one request a minute
    assert allowed(lambda: engine.check({"user": "bob"}).allowed, 2) == [True, False]
    assert engine.reset("bob", "api") == 1
    assert engine.check({"user": "bob"}).allowed


def test_a_sharded_limit_s_count_is_forgotten() -> None:
    engine = engine_for(", shards: 3")
    assert sum(engine.check({"user": "bob"}).allowed for _ in range(6)) == 3
    assert engine.reset("bob") == 1
    assert engine.check({"user": "bob"}).allowed


def test_one_rule_s_override_is_forgotten_and_the_other_rule_s_count_kept() -> None:
    text = rules("") + "  - {name: web, rate: 3/minute, algorithm: fixed_window, by: user}\n"
    engine = RuleEngine(loads(text), MemoryStore(clock=FakeClock(START)))
    engine.set_override("api", "2/minute", duration="10m", reason="a test")
    # the override denies the third check, which therefore counts nowhere: web has 2
    assert allowed(lambda: engine.check({"user": "bob"}).allowed, 3) == [True, True, False]
    assert engine.reset("bob", "api") == 1
    assert engine.check({"user": "bob"}).allowed  # the override's count is forgotten
    denied = engine.check({"user": "bob"})  # web's is not: its third, this time
    assert not denied.allowed
    assert denied.rule is not None
    assert denied.rule.name == "web"


def test_a_rule_nobody_names_is_unknown() -> None:
    with pytest.raises(UnknownRule, match="nope"):
        engine_for("").reset("bob", "nope")


def test_the_async_twin_forgets_an_override_s_count() -> None:
    async def main() -> tuple[list[bool], int, bool]:
        engine = AsyncRuleEngine(loads(rules("")), AsyncMemoryStore(clock=FakeClock(START)))
        await engine.aset_override("api", "2/minute", duration="10m", reason="a test")
        before = [(await engine.acheck({"user": "bob"})).allowed for _ in range(3)]
        count = await engine.areset("bob")
        return before, count, (await engine.acheck({"user": "bob"})).allowed

    assert asyncio.run(main()) == ([True, True, False], 1, True)


def test_the_async_twin_forgets_an_adaptive_limit_s_count() -> None:
    text = rules(", adaptive: {signal: load, good: 1, bad: 2, floor: 1%}")

    async def main() -> tuple[list[bool], int, bool]:
        engine = AsyncRuleEngine(loads(text), AsyncMemoryStore(clock=FakeClock(START)))
        engine.set_load("load", 2.0)
        before = [(await engine.acheck({"user": "bob"})).allowed for _ in range(2)]
        count = await engine.areset("bob", "api")
        return before, count, (await engine.acheck({"user": "bob"})).allowed

    assert asyncio.run(main()) == ([True, False], 1, True)


def test_the_async_twin_forgets_a_sharded_count() -> None:
    async def main() -> tuple[int, int, bool]:
        store = AsyncMemoryStore(clock=FakeClock(START))
        engine = AsyncRuleEngine(loads(rules(", shards: 3")), store)
        admitted = [(await engine.acheck({"user": "bob"})).allowed for _ in range(6)]
        count = await engine.areset("bob")
        return sum(admitted), count, (await engine.acheck({"user": "bob"})).allowed

    assert asyncio.run(main()) == (3, 1, True)


def redis_rules(extra: str) -> str:
    """A rule whose name no other test on the shared server uses."""
    name = f"t{uuid.uuid4().hex[:8]}"
    return f"rules:\n  - {{name: {name}, rate: 3/hour, algorithm: fixed_window, by: user{extra}}}\n"


def test_a_sharded_count_is_forgotten_on_redis(redis_single: RedisServer) -> None:
    store = RedisStore(redis_single.url, timeout=LIVE)
    try:
        engine = RuleEngine(loads(redis_rules(", shards: 3")), store)
        assert sum(engine.check({"user": "bob"}).allowed for _ in range(6)) == 3
        assert engine.reset("bob") == 1
        assert engine.check({"user": "bob"}).allowed
        engine.close()
    finally:
        store.close()


def test_the_async_twin_forgets_a_sharded_count_on_redis(redis_single: RedisServer) -> None:
    async def main() -> tuple[int, int, bool]:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            engine = AsyncRuleEngine(loads(redis_rules(", shards: 3")), store)
            admitted = [(await engine.acheck({"user": "bob"})).allowed for _ in range(6)]
            count = await engine.areset("bob")
            after = (await engine.acheck({"user": "bob"})).allowed
            await engine.aclose()
            return sum(admitted), count, after

    assert asyncio.run(main()) == (3, 1, True)


def test_a_two_tier_count_is_forgotten_on_redis(redis_single: RedisServer) -> None:
    store = RedisStore(redis_single.url, timeout=LIVE)
    try:
        engine = RuleEngine(loads(redis_rules(", store: two_tier")), store)
        assert allowed(lambda: engine.check({"user": "bob"}).allowed, 4) == [True] * 3 + [False]
        assert engine.reset("bob") == 1
        assert engine.check({"user": "bob"}).allowed
        engine.close()
    finally:
        store.close()


def test_the_async_twin_forgets_a_two_tier_count(redis_single: RedisServer) -> None:
    async def main() -> tuple[list[bool], int, bool]:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            engine = AsyncRuleEngine(loads(redis_rules(", store: two_tier")), store)
            before = [(await engine.acheck({"user": "bob"})).allowed for _ in range(4)]
            count = await engine.areset("bob")
            after = (await engine.acheck({"user": "bob"})).allowed
            await engine.aclose()
            return before, count, after

    assert asyncio.run(main()) == ([True] * 3 + [False], 1, True)

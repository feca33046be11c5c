"""``on_failure="local_fallback"``: while Redis is down each process enforces the
limit divided by the instances sharing it, marked degraded; back to Redis after."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from ratewarden import AsyncLimiter, ConfigurationError, Limiter, hit_many
from ratewarden._clock import FakeClock
from ratewarden.rules import RuleEngine
from ratewarden.stores.redis import AsyncRedisStore, RedisStore, TwoTierSettings
from tests.redis_server import LIVE, RedisServer, redis_server


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with redis_server() as started:
        yield started


def name() -> str:
    return f"n{uuid.uuid4().hex}"


def recover(store: RedisStore | AsyncRedisStore) -> None:
    """Lets the breaker's next probe go out now (it reads the real monotonic clock)."""
    store.breaker.open_until = 0.0
    store.breaker.probing = False


def test_the_limit_divided_by_the_instances(server: RedisServer) -> None:
    clock = FakeClock(1_800_000_000.0)
    store = RedisStore(server.url, clock=clock, instances=4, timeout=LIVE)
    limiter = Limiter("100/minute", store=store, name=name(), algorithm="fixed_window",
                      on_failure="local_fallback")  # fmt: skip
    assert [limiter.hit("k").allowed for _ in range(10)] == [True] * 10
    server.kill()
    during = [limiter.hit("k") for _ in range(40)]
    assert sum(d.allowed for d in during) == 25  # 100 / 4, counted here from nothing
    assert all(d.degraded for d in during)
    assert not limiter.peek("k").allowed  # a peek counts nothing and says so
    server.start()
    recover(store)
    after = limiter.hit("k")  # the restarted Redis kept nothing: a fresh window
    assert after.allowed
    assert not after.degraded
    assert after.remaining == 99
    store.close()


def test_a_callable_counts_the_instances_each_time(server: RedisServer) -> None:
    members = [2]
    store = RedisStore(server.url, clock=FakeClock(), instances=lambda: members[0], timeout=LIVE)
    limiter = Limiter("10/minute", store=store, name=name(), algorithm="fixed_window",
                      on_failure="local_fallback")  # fmt: skip
    server.kill()
    assert sum(limiter.hit("k").allowed for _ in range(20)) == 5
    members[0] = 5  # the fleet grew: a part of its own, from nothing
    assert sum(limiter.hit("k").allowed for _ in range(20)) == 2
    members[0] = 0  # nonsense (or a count that fails): the last good one, 5, holds
    assert not limiter.hit("k").allowed
    store.close()


def test_tiers_fall_back_together(server: RedisServer) -> None:
    store = RedisStore(server.url, clock=FakeClock(), instances=2, timeout=LIVE)
    minute = Limiter("20/minute", store=store, name=name(), on_failure="local_fallback")
    hour = Limiter("8/hour", store=store, name=name(), on_failure="local_fallback")
    server.kill()
    decisions = [hit_many([(minute, "k"), (hour, "k")]) for _ in range(10)]
    assert sum(d.allowed for d in decisions) == 4  # the hour's half
    assert minute.peek("k").remaining == 6  # the minute's half, less what passed
    store.close()


def test_other_policies_beside_it_still_answer(server: RedisServer) -> None:
    store = RedisStore(server.url, clock=FakeClock(), instances=2, timeout=LIVE)
    local = Limiter("4/minute", store=store, name=name(), on_failure="local_fallback")
    closed = Limiter("100/minute", store=store, name=name(), on_failure="fail_closed")
    server.kill()
    decision = hit_many([(local, "k"), (closed, "k")])
    assert not decision.allowed
    assert decision.degraded


def test_async_and_two_tier(server: RedisServer) -> None:
    async def main() -> tuple[int, int]:
        clock = FakeClock(1_800_000_000.0)
        store = AsyncRedisStore(server.url, clock=clock, instances=3, timeout=LIVE,
                                two_tier=TwoTierSettings(sync_interval=60))  # fmt: skip
        exact = AsyncLimiter("30/minute", store=store, name=name(), algorithm="fixed_window",
                             on_failure="local_fallback")  # fmt: skip
        local = AsyncLimiter("30/minute", store=store, name=name(), algorithm="fixed_window",
                             on_failure="local_fallback", two_tier=True)  # fmt: skip
        server.kill()
        passed_exact = sum([(await exact.hit("k")).allowed for _ in range(20)])
        passed_local = sum([(await local.hit("k", 5)).allowed for _ in range(20)])
        await store.aclose()
        return passed_exact, passed_local

    passed_exact, passed_local = asyncio.run(main())
    assert passed_exact == 10
    assert passed_local == 2  # a cost of 5 against 30 / 3: twice, Redis never reached


def test_bad_instances_are_refused(server: RedisServer) -> None:
    with pytest.raises(ConfigurationError, match="instances"):
        RedisStore(server.url, instances=0)


def test_rule_files_take_it(server: RedisServer, tmp_path: object) -> None:
    from pathlib import Path  # noqa: PLC0415

    path = Path(str(tmp_path)) / "rules.yaml"
    path.write_text("defaults: {on_failure: local_fallback}\nrules:\n"
                    "  - {name: api, rate: 6/minute, algorithm: fixed_window}\n")  # fmt: skip
    store = RedisStore(server.url, clock=FakeClock(), instances=3, timeout=LIVE)
    engine = RuleEngine(path, store)
    server.kill()
    outcomes = [engine.check({}) for _ in range(5)]
    assert [o.allowed for o in outcomes] == [True, True, False, False, False]
    store.close()

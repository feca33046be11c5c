"""Multi-tier checks in Redis (_many.lua, and per-slot calls with refunds in a
cluster) against the memory store, on the same scenarios and the same clock.

Mixed algorithms and rates, 1-4 tiers, tiers that repeat. In the cluster, once with
every key under one hash tag (one script call) and once with the keys spread over
slots (one call per slot, refunds when a later slot denies): uncontended, both must
decide exactly as the memory store does and leave exactly its counts.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from ratewarden import (
    AsyncLimiter,
    Decision,
    FakeClock,
    MemoryStore,
    ahit_many,
    hit_many,
)
from ratewarden._hitmany import hit_tiers
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.redis_server import RedisCluster, RedisServer
from tests.strategies import TiersScenario, tier_scenarios

EPOCH_S = 1_763_700_000  # 2025-11-21: realistic magnitudes


def same(got: Decision, expected: Decision) -> bool:
    """Equal counts and verdicts; durations within the microsecond Redis rounds to
    (it counts in us, the memory store in ns: a bucket's 333.334 us is 334 us there).
    Decisions agree exactly because every event falls on a whole millisecond."""
    return (
        (got.allowed, got.limit, got.remaining, got.rule)
        == (expected.allowed, expected.limit, expected.remaining, expected.rule)
        and abs(got.reset_after - expected.reset_after) <= 1.001e-6
        and (
            got.retry_after == expected.retry_after
            or abs(got.retry_after - expected.retry_after) <= 1.001e-6
        )
    )


@pytest.fixture(scope="module", params=["single", "cluster-one-slot", "cluster-spread"])
def where(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    """A Redis client and how to tag keys: "" (one node), "{t}" (one slot)."""
    client: redis.Redis | redis.RedisCluster
    if request.param == "single":
        server: RedisServer = request.getfixturevalue("redis_single")
        client = server.client()
    else:
        cluster: RedisCluster = request.getfixturevalue("redis_6_nodes")
        client = cluster.client()
    with client:
        yield client, "{t}" if request.param == "cluster-one-slot" else ""


@given(sc=tier_scenarios(max_events=12))
def test_async_redis_many_equals_memory(sc: TiersScenario, where: tuple[Any, str]) -> None:
    """The same through AsyncRedisStore (its own client on the same server)."""
    client, tag = where
    url = (
        f"redis+cluster://127.0.0.1:{client.get_default_node().port}"  # type: ignore[no-untyped-call]
        if isinstance(client, redis.RedisCluster)
        else f"redis://127.0.0.1:{client.connection_pool.connection_kwargs['port']}/0"
    )
    clock = FakeClock(EPOCH_S)
    clock.now_ns += 123_456_000
    memory = MemoryStore(clock=clock)
    run = uuid.uuid4().hex[:8]
    ours = [spec.limiter(memory, run) for spec in sc.tiers]
    keys = [f"{tag}{spec.key}" for spec in sc.tiers]

    async def main() -> None:
        async with AsyncRedisStore(url, clock=clock, timeout=5.0) as store:
            theirs = [spec.limiter(store, run, AsyncLimiter) for spec in sc.tiers]
            for gap, costs in sc.events:
                clock.advance(gap / 1000)
                expected = hit_many(list(zip(ours, keys, costs, strict=True)))
                got = await ahit_many(list(zip(theirs, keys, costs, strict=True)))
                assert same(got, expected), f"{got} != {expected} at +{gap} ms, costs {costs}"
                for mine, yours, key in zip(ours, theirs, keys, strict=True):
                    assert same(await yours.peek(key), mine.peek(key)), "counts differ after"

    asyncio.run(main())


@given(sc=tier_scenarios())
def test_redis_many_equals_memory(sc: TiersScenario, where: tuple[Any, str]) -> None:
    client, tag = where
    clock = FakeClock(EPOCH_S)
    clock.now_ns += 123_456_000  # off the second, on a whole millisecond
    memory = MemoryStore(clock=clock)
    redis = RedisStore(client, clock=clock)
    run = uuid.uuid4().hex[:8]
    ours = [spec.limiter(memory, run) for spec in sc.tiers]
    theirs = [spec.limiter(redis, run) for spec in sc.tiers]
    keys = [f"{tag}{spec.key}" for spec in sc.tiers]
    for gap, costs in sc.events:
        clock.advance(gap / 1000)
        expected = hit_many(list(zip(ours, keys, costs, strict=True)))
        got = hit_many(list(zip(theirs, keys, costs, strict=True)))
        assert same(got, expected), f"{got} != {expected} at +{gap} ms, costs {costs}"
        for mine, yours, key in zip(ours, theirs, keys, strict=True):
            assert same(yours.peek(key), mine.peek(key)), "counts differ after the check"


@given(sc=tier_scenarios(max_events=12))
def test_async_batch_equals_memory(sc: TiersScenario, redis_single: RedisServer) -> None:
    """Single checks on one node go out as _batch.lua calls, every check of a loop
    turn in one: hits and peeks of all the tiers at one instant, gathered (so one
    batch, repeated keys included), must answer as the memory store does in order."""
    clock = FakeClock(EPOCH_S)
    clock.now_ns += 123_456_000
    memory = MemoryStore(clock=clock)
    run = uuid.uuid4().hex[:8]
    ours = [spec.limiter(memory, run) for spec in sc.tiers]
    keys = [spec.key for spec in sc.tiers]

    async def main() -> None:
        async with AsyncRedisStore(redis_single.url, clock=clock, timeout=5.0) as store:
            theirs = [spec.limiter(store, run, AsyncLimiter) for spec in sc.tiers]
            for gap, costs in sc.events:
                clock.advance(gap / 1000)
                expected: list[Decision] = []
                for mine, key, cost in zip(ours, keys, costs, strict=True):
                    expected += (mine.peek(key, cost), mine.hit(key, cost))
                got = await asyncio.gather(
                    *(
                        call(key, cost)
                        for yours, key, cost in zip(theirs, keys, costs, strict=True)
                        for call in (yours.peek, yours.hit)
                    )
                )
                for g, e in zip(got, expected, strict=True):
                    assert same(g, e), f"{g} != {e} at +{gap} ms, costs {costs}"

    asyncio.run(main())


@given(sc=tier_scenarios(max_events=15), split=st.integers(0, 4))
def test_redis_tiers_with_shadow_equal_memory(
    sc: TiersScenario, split: int, where: tuple[Any, str]
) -> None:
    """hit_tiers: the first ``split`` tiers enforced, the rest shadow tiers, in one
    script call (two calls when a cluster's keys span slots); both Decisions and
    every count as the memory store has them."""
    client, tag = where
    clock = FakeClock(EPOCH_S)
    clock.now_ns += 123_456_000
    memory = MemoryStore(clock=clock)
    redis_store = RedisStore(client, clock=clock)
    run = uuid.uuid4().hex[:8]
    ours = [spec.limiter(memory, run) for spec in sc.tiers]
    theirs = [spec.limiter(redis_store, run) for spec in sc.tiers]
    keys = [f"{tag}{spec.key}" for spec in sc.tiers]
    cut = min(split, len(sc.tiers))
    for gap, costs in sc.events:
        clock.advance(gap / 1000)
        mine = list(zip(ours, keys, costs, strict=True))
        yours = list(zip(theirs, keys, costs, strict=True))
        expected = hit_tiers(mine[:cut], mine[cut:])
        got = hit_tiers(yours[:cut], yours[cut:])
        for g, e in zip(got, expected, strict=True):
            assert (g is None) == (e is None), f"{got} != {expected}"
            if g is not None and e is not None:
                assert same(g, e), f"{g} != {e} at +{gap} ms, costs {costs}"
        for a, b, key in zip(ours, theirs, keys, strict=True):
            assert same(b.peek(key), a.peek(key)), "counts differ after the check"

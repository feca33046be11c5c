"""Hot-key sharding on real Redis: on the 6-node cluster a key's shards sit on
every master, two processes together admit the limit exactly, and a sharded tier
takes part in multi-tier checks and rule files; on one server, the async store's
batched script carries the shards too.

A fake clock drives the time every script sees, so nothing sleeps to a boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from ratewarden import AsyncLimiter, FakeClock, Limiter, ahit_many, hit_many
from ratewarden.rules import RuleEngine, loads
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.redis_server import LIVE, RedisCluster, RedisServer


def name() -> str:
    return f"s{uuid.uuid4().hex[:8]}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000.0)  # on a whole hour: windows start here


@pytest.fixture
def closing() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as stack:
        yield stack


def keys_per_master(store: RedisStore, pattern: str) -> Counter[int]:
    """How many keys matching ``pattern`` each master holds."""
    found: Counter[int] = Counter()
    for node in store.client.get_primaries():
        client = store.client.get_redis_connection(node)
        found[node.port] = sum(1 for _ in client.scan_iter(match=pattern, count=1000))
    return found


def test_two_processes_admit_the_limit_exactly_on_the_cluster(
    redis_6_nodes: RedisCluster, clock: FakeClock, closing: contextlib.ExitStack
) -> None:
    one, two = (
        closing.enter_context(RedisStore(redis_6_nodes.url, timeout=LIVE, clock=clock))
        for _ in range(2)
    )
    tag = name()
    limiters = [
        Limiter("600/hour", store=s, algorithm="fixed_window", name=tag, shards=6)
        for s in (one, two)
    ]
    admitted = sum(limiters[i % 2].hit("celebrity").allowed for i in range(1000))
    assert admitted == 600
    spread = keys_per_master(one, f"{tag}:*celebrity")
    assert sorted(spread.values()) == [2, 2, 2], spread  # two shards on each master


def test_a_sharded_tier_in_a_check_that_spans_slots(
    redis_6_nodes: RedisCluster, clock: FakeClock, closing: contextlib.ExitStack
) -> None:
    store = closing.enter_context(RedisStore(redis_6_nodes.url, timeout=LIVE, clock=clock))
    tag = name()
    hot = Limiter("6/hour", store=store, algorithm="fixed_window", name=tag + "-hot", shards=3)
    user = Limiter("100/hour", store=store, algorithm="fixed_window", name=tag + "-user")
    outcomes = [hit_many([(user, "{u}"), (hot, "{u}")]).allowed for _ in range(9)]
    assert outcomes == [True] * 6 + [False] * 3
    assert user.peek("{u}").remaining == 94  # the denied ones refunded
    assert not hot.peek("{u}").allowed


def test_async_store_on_the_cluster(redis_6_nodes: RedisCluster, clock: FakeClock) -> None:
    async def main() -> tuple[int, int]:
        async with AsyncRedisStore(redis_6_nodes.url, timeout=LIVE, clock=clock) as store:
            tag = name()
            hot = AsyncLimiter("60/hour", store=store, algorithm="gcra", name=tag, shards=6)
            other = AsyncLimiter("1000/hour", store=store, name=tag + "-o")
            alone = await asyncio.gather(*(hot.hit("k") for _ in range(100)))
            together = [(await ahit_many([(hot, "j"), (other, "j")])).allowed for _ in range(80)]
            return sum(d.allowed for d in alone), sum(together)

    assert asyncio.run(main()) == (60, 60)


def test_async_batched_on_one_server(redis_single: RedisServer, clock: FakeClock) -> None:
    async def main() -> int:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE, clock=clock) as store:
            hot = AsyncLimiter("50/hour", store=store, algorithm="sliding_window_counter",
                               name=name(), shards=5)  # fmt: skip
            decisions = await asyncio.gather(*(hot.hit("k") for _ in range(120)))
            return sum(d.allowed for d in decisions)

    assert asyncio.run(main()) == 50


def test_rule_file_on_the_cluster(
    redis_6_nodes: RedisCluster, clock: FakeClock, closing: contextlib.ExitStack
) -> None:
    store = closing.enter_context(RedisStore(redis_6_nodes.url, timeout=LIVE, clock=clock))
    tag = name()
    engine = RuleEngine(
        loads(f"rules: [{{name: {tag}, rate: 80/hour, algorithm: fixed_window, shards: 8}}]"),
        store,
    )
    assert sum(engine.check({}).allowed for _ in range(100)) == 80
    assert all(keys_per_master(store, f"{tag}:*").values())  # on every master

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from ratewarden import AsyncLimiter, ConfigurationError, FakeClock, StoreUnavailable, ahit_many
from ratewarden.stores.failure import OnFailure
from ratewarden.stores.redis import AsyncRedisStore
from ratewarden.stores.redis._batcher import _Item
from tests.redis_server import LIVE, RedisCluster, RedisServer, free_port


def name() -> str:
    return f"a{uuid.uuid4().hex[:8]}"


def test_async_limits_exactly_under_64_concurrent_callers(redis_single: RedisServer) -> None:
    async def main() -> tuple[int, int]:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            limiter = AsyncLimiter("500/hour", algorithm="token_bucket", store=store, name=name())
            pipelines = 0
            send = store._batcher._pipeline

            async def counting(
                batch: list[_Item], deadline: float | None, load: Sequence[str] = ()
            ) -> list[Any]:
                nonlocal pipelines
                pipelines += 1
                return await send(batch, deadline, load)

            store._batcher._pipeline = counting  # type: ignore[method-assign]

            async def caller() -> int:
                return sum([(await limiter.hit("shared")).allowed for _ in range(20)])

            admitted = sum(await asyncio.gather(*(caller() for _ in range(64))))
            return admitted, pipelines

    admitted, pipelines = asyncio.run(main())
    assert admitted == 500  # 1,280 checks, exactly the limit admitted
    assert pipelines <= 1280 // 8  # coalesced: many checks per round trip


def test_async_matches_the_sync_semantics(redis_single: RedisServer) -> None:
    async def main() -> None:
        clock = FakeClock(1_700_000_000)
        async with AsyncRedisStore(redis_single.url, clock=clock, timeout=LIVE) as store:
            limiter = AsyncLimiter("2/second", algorithm="gcra", store=store, name=name())
            assert (await limiter.hit("k", 2)).allowed
            assert (await limiter.peek("k")).retry_after == 0.5
            start = clock.now_ns
            assert (await limiter.acquire("k", max_wait=1.0)).allowed
            assert clock.now_ns - start == 500_000_000
            await limiter.reset("k")
            assert (await limiter.hit("k")).remaining == 1
            await store.client.script_flush()  # NOSCRIPT inside a pipeline: reloaded
            assert (await limiter.hit("k")).remaining == 0

    asyncio.run(main())


@pytest.mark.parametrize(("policy", "allowed"), [("fail_open", True), ("fail_closed", False)])
def test_async_failure_policy(policy: OnFailure, allowed: bool) -> None:
    async def main() -> None:
        async with AsyncRedisStore(f"redis://127.0.0.1:{free_port()}/0") as store:
            limiter = AsyncLimiter("5/hour", store=store, on_failure=policy)
            decisions = await asyncio.gather(*(limiter.hit("k") for _ in range(10)))
            assert all(d.allowed is allowed and d.degraded for d in decisions)
            strict = AsyncLimiter("5/hour", store=store)
            with pytest.raises(StoreUnavailable):
                await strict.hit("k")

    asyncio.run(main())


def test_async_cluster_exact_under_concurrency(redis_6_nodes: RedisCluster) -> None:
    async def main() -> tuple[list[int], set[str]]:
        async with AsyncRedisStore(redis_6_nodes.url, timeout=LIVE) as store:
            limiter = AsyncLimiter("50/hour", algorithm="gcra", store=store, name=name())
            users = [f"{{user-{i}}}" for i in range(12)]

            async def caller(user: str) -> int:
                return sum([(await limiter.hit(user)).allowed for _ in range(10)])

            admitted = await asyncio.gather(*(caller(u) for u in users for _ in range(8)))
            per_user = [sum(admitted[i * 8 : i * 8 + 8]) for i in range(len(users))]
            nodes = {store.client.get_node_from_key(limiter.key_prefix + u).name for u in users}
            await store.client.script_flush()  # NOSCRIPT on every master: loaded again
            fresh = await asyncio.gather(*(limiter.hit(f"{{new-{i}}}") for i in range(12)))
            assert all(d.allowed and d.remaining == 49 for d in fresh)
            return per_user, nodes

    per_user, nodes = asyncio.run(main())
    assert per_user == [50] * 12  # 80 checks each, from 8 concurrent callers
    assert len(nodes) == 3  # the users really spread over the three masters


def test_a_failing_batch_never_leaves_a_caller_waiting(redis_single: RedisServer) -> None:
    async def main() -> None:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            limiter = AsyncLimiter("5/hour", store=store, name=name())

            async def broken(
                batch: list[_Item], deadline: float | None, load: Sequence[str] = ()
            ) -> list[Any]:
                raise TypeError("a bug in the pipeline")

            store._batcher._pipeline = broken  # type: ignore[method-assign]
            results = await asyncio.wait_for(
                asyncio.gather(*(limiter.hit("k") for _ in range(3)), return_exceptions=True), 5
            )
            assert all(isinstance(r, TypeError) for r in results)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_batch": 0}, "max_batch"), ({"timeout": 0}, "timeout"), ({"timeout": "1"}, "timeout")],
)
def test_bad_options(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        AsyncRedisStore("redis://127.0.0.1:1/0", **kwargs)  # type: ignore[arg-type]


def test_async_hit_many_exact_under_concurrency(redis_single: RedisServer) -> None:
    async def main() -> tuple[int, list[int]]:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            tag = name()
            minute = AsyncLimiter(
                "300/minute", algorithm="sliding_window_log", store=store, name=tag + "m"
            )
            hour = AsyncLimiter("200/hour", algorithm="token_bucket", store=store, name=tag + "h")

            async def caller() -> int:
                return sum(
                    [(await ahit_many([(minute, "u"), (hour, "u")])).allowed for _ in range(10)]
                )

            admitted = sum(await asyncio.gather(*(caller() for _ in range(64))))
            left = [(await minute.peek("u")).remaining, (await hour.peek("u")).remaining]
            return admitted, left

    admitted, left = asyncio.run(main())
    assert admitted == 200  # 640 requests; the hour tier holds 200
    assert left == [100, 0]  # denied requests took nothing from the minute


def test_hits_and_multi_tier_checks_in_one_batch_each_get_their_own_answer(
    redis_single: RedisServer,
) -> None:
    """A turn's single checks go out as one _batch.lua call, a multi-tier check as
    its own script in the same round trip: each caller must get its own answer
    back, in its place, whatever the mix."""

    async def main() -> tuple[list[int], list[int]]:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            tag = name()
            single = [
                AsyncLimiter(f"{n}/hour", algorithm="fixed_window", store=store, name=f"{tag}{n}")
                for n in (5, 9, 13)
            ]
            tiers = [
                AsyncLimiter("7/hour", algorithm="token_bucket", store=store, name=tag + "t"),
                AsyncLimiter("50/hour", algorithm="gcra", store=store, name=tag + "g"),
            ]

            async def one(i: int) -> tuple[int, bool]:
                if i % 4 == 3:
                    decision = await ahit_many([(limiter, "u") for limiter in tiers])
                    return 3, decision.allowed
                return i % 3, (await single[i % 3].hit("u")).allowed

            admitted = [0, 0, 0, 0]
            for which, allowed in await asyncio.gather(*(one(i) for i in range(240))):
                admitted[which] += allowed
            left = [(await limiter.peek("u")).remaining for limiter in single]
            return admitted, left

    admitted, left = asyncio.run(main())
    assert admitted == [5, 9, 13, 7]
    assert left == [0, 0, 0]


def test_async_hit_many_failure_policy() -> None:
    async def main() -> None:
        async with AsyncRedisStore(f"redis://127.0.0.1:{free_port()}/0") as store:
            a = AsyncLimiter("5/hour", store=store, on_failure="fail_open", name="a")
            b = AsyncLimiter("5/hour", store=store, on_failure="fail_closed", name="b")
            decision = await ahit_many([(a, "k"), (b, "k")])
            assert not decision.allowed
            assert decision.degraded
            assert decision.rule == "b"

    asyncio.run(main())

"""A fleet quota's waiting callers in priority classes: one line in class
order, no barging past it, every caller within its own deadline."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from ratewarden import FakeClock, RateLimitTimeout
from ratewarden.fleet import AsyncFleetQuota, QuotaConfig
from tests.redis_server import RedisServer

START = 1_763_900_000.0


def test_waiting_callers_are_served_by_class(redis_single: RedisServer) -> None:
    name = f"q-{uuid.uuid4().hex[:10]}"
    served: list[tuple[str, float]] = []
    short_waiting: list[bool] = []  # at each hand-over: whether low-3 still stands in line

    async def main() -> None:
        async with aioredis.Redis(port=redis_single.port) as client:
            clock = FakeClock(START)
            quota = await AsyncFleetQuota(
                name, client, config=QuotaConfig("1/second", "equal"), member_id="a",
                clock=clock, coordinator_clock=clock, background=False,
            ).start()  # fmt: skip
            clock.advance(1.0)  # the window the grant applies from
            start = clock.time_ns()
            await quota.acquire(0)  # this window's permit
            leave = quota._line.leave
            short = start + 2_500_000_000  # low-3's deadline

            def watched_leave(key: str) -> None:
                entries = quota._line._queues.get(key, [])
                short_waiting.append(any(entry[3] == short for entry in entries))
                leave(key)

            quota._line.leave = watched_leave  # type: ignore[method-assign]

            async def caller(who: str, priority: int, max_wait: float = 10) -> None:
                try:
                    await quota.acquire(max_wait, priority=priority)
                    served.append((who, (clock.time_ns() - start) / 1e9))
                except RateLimitTimeout:
                    served.append((who + " told", 0.0))

            await asyncio.gather(caller("low-1", 0), caller("low-2", 0),
                                 caller("low-3", 0, max_wait=2.5), caller("high-1", 5),
                                 caller("high-2", 5))  # fmt: skip
            await quota.aclose()

    asyncio.run(main())
    by_name = dict(served)
    # low-1 held the turn: its permit (t=1) is its own; then every high one
    # goes before the lower class, arrived earlier or not
    assert [by_name[who] for who in ("low-1", "high-1", "high-2", "low-2")] == [1, 2, 3, 4]
    # low-3 (2.5 s) cannot see t=3's permit: told when the head went to sleep
    # towards it, so no longer in line when that permit was handed over
    assert "low-3 told" in by_name
    assert short_waiting[:3] == [True, True, False]


def test_a_newcomer_never_barges_past_the_line(redis_single: RedisServer) -> None:
    name = f"q-{uuid.uuid4().hex[:10]}"

    async def main() -> list[str]:
        async with aioredis.Redis(port=redis_single.port) as client:
            clock = FakeClock(START)
            quota = await AsyncFleetQuota(
                name, client, config=QuotaConfig("1/second", "equal"), member_id="a",
                clock=clock, coordinator_clock=clock, background=False,
            ).start()  # fmt: skip
            clock.advance(1.0)
            await quota.acquire(0)
            order: list[str] = []

            async def waiter() -> None:
                await quota.acquire(10, priority=5)
                order.append("waiter")

            task = asyncio.create_task(waiter())
            await asyncio.sleep(0)  # the waiter stands in line, the head
            with pytest.raises(RateLimitTimeout):
                await quota.acquire(0)  # a try-once newcomer: the line is busy
            await task
            await quota.aclose()
            return order

    assert asyncio.run(main()) == ["waiter"]

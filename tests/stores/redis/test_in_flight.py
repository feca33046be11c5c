"""AsyncRedisStore on one server keeps a few round trips out at once on its own
connection: the checks of each loop turn go out while Redis works on the last
ones, answered in the order they were sent, over one connection."""

from __future__ import annotations

import asyncio

import pytest
import redis

from ratewarden import AsyncLimiter, Decision
from ratewarden.stores.redis import AsyncRedisStore
from ratewarden.stores.redis._batcher import IN_FLIGHT, SPLIT_AT
from tests.redis_server import LIVE, RedisServer

TURNS = IN_FLIGHT + 2  # more turns of checks than round trips may be out
PER_TURN = 5


def evalsha_calls(admin: redis.Redis) -> int:
    stats = admin.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0))


def connections(admin: redis.Redis) -> int:
    return len(admin.client_list()) - 1  # not the admin's own


def test_turns_of_checks_go_out_while_redis_works_and_come_back_in_order(
    redis_single: RedisServer,
) -> None:
    admin = redis.Redis.from_url(redis_single.url)
    before = connections(admin)

    async def main() -> list[Decision]:
        store = AsyncRedisStore(redis_single.url, timeout=LIVE)
        limiter = AsyncLimiter("1000/hour", algorithm="fixed_window", store=store, name="fl")
        await limiter.hit("warm")  # connected, scripts loaded
        admin.config_resetstat()
        admin.client_pause(500, all=True)  # Redis holds every round trip for a while
        checks = []
        for _ in range(TURNS):
            checks += [asyncio.ensure_future(limiter.hit("k")) for _ in range(PER_TURN)]
            await asyncio.sleep(0)  # a turn of the loop: its checks go out
            await asyncio.sleep(0)
        decisions = await asyncio.gather(*checks)
        await store.aclose()
        return decisions

    decisions = asyncio.run(main())
    # every turn up to IN_FLIGHT went out in a round trip of its own, not held back
    # for the one before to come back; the rest waited and went together
    assert evalsha_calls(admin) >= IN_FLIGHT
    # one key, counted in the order the checks were made
    assert [d.remaining for d in decisions] == list(range(999, 999 - TURNS * PER_TURN, -1))
    assert connections(admin) == before  # the store's one connection, closed


def test_round_trips_that_start_together_share_one_connection(
    redis_single: RedisServer,
) -> None:
    admin = redis.Redis.from_url(redis_single.url)

    async def main() -> int:
        store = AsyncRedisStore(redis_single.url, timeout=LIVE)
        limiter = AsyncLimiter("1000/hour", algorithm="fixed_window", store=store, name="sh")
        before = connections(admin)
        checks = []
        for turn in range(TURNS):  # each turn's round trip finds no connection yet
            checks.append(asyncio.ensure_future(limiter.hit(f"k{turn}")))
            await asyncio.sleep(0)
        decisions = await asyncio.gather(*checks)
        assert all(d.allowed and not d.degraded for d in decisions)
        opened = connections(admin) - before
        await store.aclose()
        return opened

    assert asyncio.run(main()) == 1


@pytest.mark.parametrize(("checks", "calls"), [(SPLIT_AT + 3, 2), (SPLIT_AT - 1, 1)])
def test_a_large_turn_that_finds_no_round_trip_out_goes_in_two_halves(
    redis_single: RedisServer, checks: int, calls: int
) -> None:
    """Redis answers the first half while it runs the second: its callers' next
    checks are made meanwhile, instead of client and server taking turns. A small
    turn goes whole: a second call would cost more than it overlaps."""
    admin = redis.Redis.from_url(redis_single.url)

    async def main() -> list[Decision]:
        store = AsyncRedisStore(redis_single.url, timeout=LIVE)
        limiter = AsyncLimiter("1000/hour", algorithm="fixed_window", store=store, name="hv")
        await limiter.hit("warm")
        admin.config_resetstat()
        decisions = await asyncio.gather(*(limiter.hit(f"k{checks}") for _ in range(checks)))
        await store.aclose()
        return decisions

    decisions = asyncio.run(main())
    assert evalsha_calls(admin) == calls
    assert [d.remaining for d in decisions] == list(range(999, 999 - checks, -1))

"""Calendar limits on Redis: periods by the server's clock, keys expiring at the
period's end, and a client clock further than the allowed skew from the server's
refused in a defined way (the limit's on_failure answers; the breaker stays shut).
The Lua against Python parity is tests/parity/test_calendar_parity.py."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from ratewarden import AsyncLimiter, ConfigurationError, FakeClock, Limiter, StoreError, hit_many
from ratewarden.algorithms.calendar import Calendar
from ratewarden.stores.redis import AsyncRedisStore, ClockSkew, RedisStore
from ratewarden.stores.redis._script_calls import SKEW_NS
from tests.redis_server import LIVE, RedisCluster, RedisServer

BERLIN = ZoneInfo("Europe/Berlin")
SKEW = SKEW_NS / 1e9
JUNE = datetime(2024, 6, 15, 12, 0, tzinfo=BERLIN).timestamp()


def name() -> str:
    return f"cal{uuid.uuid4().hex[:8]}"


@pytest.fixture
def closing() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as stack:
        yield stack


def test_by_the_servers_time_the_reset_is_local_midnight(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    """No test clock: Redis TIME picks the period; retry_after is the time to
    Berlin's next midnight, not to a multiple of 86400 s since the epoch."""
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE))
    limiter = Limiter("2/day", calendar="Europe/Berlin", store=store, name=name())
    decisions = [limiter.hit("k") for _ in range(3)]
    end = Calendar("Europe/Berlin", "day").window(time.time_ns())[1] / 1e9
    assert [d.allowed for d in decisions] == [True, True, False]
    assert decisions[2].retry_after == pytest.approx(end - time.time(), abs=5)
    assert decisions[2].reset_after == decisions[2].retry_after


def test_the_key_expires_at_the_periods_end(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    server = FakeClock(datetime(2024, 2, 28, 18, 0, tzinfo=BERLIN).timestamp())
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE, clock=server))
    limiter = Limiter("5/month", calendar="Europe/Berlin", store=store, name=name())
    assert limiter.hit("k").reset_after == pytest.approx(30 * 3600)  # to 1 March, 00:00
    ttl_ms = store.client.pttl(f"{limiter._tier.prefix}k")
    # an explicit (test) clock keeps a minute's margin past the state's end
    assert ttl_ms == pytest.approx((30 * 3600 + 60) * 1000, abs=1000)


@pytest.mark.parametrize("off", [SKEW + 1, -SKEW - 1, 40 * 86400])
def test_a_client_clock_past_the_skew_is_refused_and_counts_nothing(
    redis_single: RedisServer, closing: contextlib.ExitStack, off: float
) -> None:
    server, client = FakeClock(JUNE), FakeClock(JUNE + off)
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE, clock=server))
    raising = Limiter("2/month", calendar="Europe/Berlin", store=store, name=name())
    raising._tier.client_clock = client
    with pytest.raises(ClockSkew, match=re.escape(f"{off:+.0f}s from the Redis")) as raised:
        raising.hit("k")
    assert isinstance(raised.value, StoreError)
    open_ = Limiter(
        "2/month", calendar="Europe/Berlin", store=store, name=name(), on_failure="fail_open"
    )
    open_._tier.client_clock = client
    assert all(open_.hit("k").allowed for _ in range(5))
    assert store.breaker.failures == 0  # this machine's clock, not the store, is at fault
    client.now_ns = server.now_ns  # clocks set right: nothing was counted
    assert open_.peek("k").remaining == 2
    assert raising.hit("k").remaining == 1


@pytest.mark.parametrize("off", [SKEW - 1, -SKEW + 1])
def test_a_client_clock_within_the_skew_counts(
    redis_single: RedisServer, closing: contextlib.ExitStack, off: float
) -> None:
    server, client = FakeClock(JUNE), FakeClock(JUNE + off)
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE, clock=server))
    limiter = Limiter("2/month", calendar="Europe/Berlin", store=store, name=name())
    limiter._tier.client_clock = client
    assert [limiter.hit("k").remaining for _ in range(3)] == [1, 0, 0]


def test_hit_many_with_a_skewed_calendar_tier_counts_in_no_tier(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    server, client = FakeClock(JUNE), FakeClock(JUNE - SKEW - 60)
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE, clock=server))
    hourly = Limiter("5/hour", algorithm="fixed_window", store=store, name=name(),
                     on_failure="fail_open")  # fmt: skip
    monthly = Limiter("5/month", calendar="Europe/Berlin", store=store, name=name(),
                      on_failure="fail_closed")  # fmt: skip
    monthly._tier.client_clock = client
    denied = hit_many([(hourly, "k"), (monthly, "k")])
    assert not denied.allowed
    assert hourly.peek("k").remaining == 5
    client.now_ns = server.now_ns
    assert hit_many([(hourly, "k"), (monthly, "k")]).remaining == 4


def test_in_an_async_batch_only_the_skewed_check_is_refused(redis_single: RedisServer) -> None:
    async def main() -> None:
        server = FakeClock(JUNE)
        async with AsyncRedisStore(redis_single.url, timeout=LIVE, clock=server) as store:
            plain = AsyncLimiter("3/day", calendar="Europe/Berlin", store=store, name=name())
            skewed = AsyncLimiter("3/day", calendar="Europe/Berlin", store=store, name=name(),
                                  on_failure="fail_closed")  # fmt: skip
            skewed._tier.client_clock = FakeClock(JUNE + SKEW + 1)
            answers = await asyncio.gather(plain.hit("k"), skewed.hit("k"), plain.hit("k"))
            assert [a.allowed for a in answers] == [True, False, True]
            assert [answers[0].remaining, answers[2].remaining] == [2, 1]

    asyncio.run(main())


def test_a_reservation_of_a_calendar_limit_is_refused_on_redis(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE))
    limiter = Limiter("5/month", calendar="Europe/Berlin", store=store, name=name())
    with pytest.raises(ConfigurationError, match="a calendar limit reserves on the memory store"):
        limiter.reserve("k", 2)
    assert limiter.peek("k").remaining == 5


def test_local_fallback_counts_the_calendar_period_in_the_process(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    server = FakeClock(datetime(2024, 1, 31, 23, 0, tzinfo=BERLIN).timestamp())
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE, clock=server))
    limiter = Limiter("2/month", calendar="Europe/Berlin", store=store, name=name(),
                      on_failure="local_fallback")  # fmt: skip
    limiter._tier.client_clock = FakeClock(server.now_ns / 1e9 + 2 * SKEW)
    decisions = [limiter.hit("k") for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert decisions[2].retry_after == pytest.approx(3600)  # local midnight, 1 February


def test_across_cluster_slots_a_skewed_calendar_tier_refunds_the_slots_that_counted(
    redis_6_nodes: RedisCluster, closing: contextlib.ExitStack
) -> None:
    server = FakeClock(JUNE)
    store = closing.enter_context(RedisStore(redis_6_nodes.url, timeout=LIVE, clock=server))
    hourly = Limiter("5/hour", algorithm="fixed_window", store=store, name=name(),
                     on_failure="fail_open")  # fmt: skip
    monthly = Limiter("5/month", calendar="Europe/Berlin", store=store, name=name(),
                      on_failure="fail_closed")  # fmt: skip
    monthly._tier.client_clock = FakeClock(JUNE + SKEW + 1)
    assert store.client.keyslot(f"{hourly._tier.prefix}a") != store.client.keyslot(
        f"{monthly._tier.prefix}b"
    )
    assert not hit_many([(hourly, "a"), (monthly, "b")]).allowed
    assert hourly.peek("a").remaining == 5  # counted in its slot, then refunded


def test_a_skewed_calendar_shadow_tier_reports_nothing(
    redis_single: RedisServer, closing: contextlib.ExitStack
) -> None:
    server = FakeClock(JUNE)
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE, clock=server))
    hourly = Limiter("5/hour", algorithm="fixed_window", store=store, name=name())
    monthly = Limiter("5/month", calendar="Europe/Berlin", store=store, name=name())
    monthly._tier.client_clock = FakeClock(JUNE - SKEW - 1)
    decision, shadow = store.hit_tiers([hourly.tier("a").check], [monthly.tier("a").check])
    assert decision is not None
    assert (decision.allowed, decision.remaining) == (True, 4)
    assert shadow is None

"""Calendar periods on Redis against the Python step (the memory store), with the
client's clock and the server's set apart.

The Redis limiter's periods come from a client clock up to the allowed skew off
the server's; the script picks the period by the server's time (the explicit
test clock). The memory store counts on the server's time alone, as the Python
step does. Every hit must give the same Decision, around month ends, 29
February, New Year and both changes of daylight saving time in Europe/Berlin,
America/New_York and Australia/Lord_Howe (a 30-minute change), through each
script a calendar limit runs in: _one.lua (the sync store, and every call on a
cluster), _many.lua (hit_many of two tiers) and _batch.lua (the asyncio store on
one node).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratewarden import (
    AsyncLimiter,
    AsyncMemoryStore,
    Decision,
    FakeClock,
    Limiter,
    MemoryStore,
    hit_many,
)
from ratewarden.algorithms.calendar import WEEKDAYS, Calendar
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.redis_server import LIVE, RedisCluster, RedisServer

# (zone, local date): the days whose ends and changes are crossed
DAYS = {
    "Europe/Berlin": ("2024-01-31", "2024-02-29", "2024-03-31", "2024-10-27", "2024-12-31"),
    "America/New_York": ("2024-01-31", "2024-02-29", "2024-03-10", "2024-11-03"),
    # DST ends 02:00 -> 01:30 on 7 April, starts 02:00 -> 02:30 on 6 October
    "Australia/Lord_Howe": ("2024-02-29", "2024-04-07", "2024-10-06", "2024-12-31"),
}
CASES = [(tz, day) for tz, days in DAYS.items() for day in days]
OFFSETS = (-299.0, 0.0, 299.0)  # the client's clock less the server's, within the skew


def instants(tz: str, day: str) -> list[float]:
    """Server times around the day's start and end and its changes of offset."""
    zone = ZoneInfo(tz)
    date = datetime.fromisoformat(day)
    edges = [datetime.combine(date + timedelta(days=d), datetime.min.time(), zone).timestamp()
             for d in (0, 1)]  # fmt: skip
    # the changes of UTC offset that day, found minute by minute
    t = edges[0]
    while t < edges[1]:
        if (
            datetime.fromtimestamp(t, zone).utcoffset()
            != datetime.fromtimestamp(t + 60, zone).utcoffset()
        ):
            edges.append(t + 60)
        t += 60
    # midnight in a skipped hour: the change itself, found by the model's definition
    out = {at + d for at in edges for d in (-3601.0, -300.5, -1.0, -0.001, 0.0, 0.25, 299.0)}
    return sorted(out)


def compare(redis: Decision, memory: Decision, at: float) -> None:
    assert (redis.allowed, redis.remaining) == (memory.allowed, memory.remaining), at
    assert redis.reset_after == pytest.approx(memory.reset_after, abs=1e-3), at
    assert redis.retry_after == pytest.approx(memory.retry_after, abs=1e-3), at


@pytest.fixture
def closing() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as stack:
        yield stack


def pair(
    store: RedisStore, memory: MemoryStore, client: FakeClock, rate: str, tz: str | None
) -> tuple[Limiter, Limiter]:
    """A Redis limiter whose periods come from ``client``, and its memory twin
    (a fixed window on the epoch when ``tz`` is None)."""
    name = f"cal{uuid.uuid4().hex[:8]}"
    options = {"algorithm": "fixed_window"} if tz is None else {"calendar": tz}
    on_redis = Limiter(rate, store=store, name=name, **options)  # type: ignore[arg-type]
    if tz is not None:
        on_redis._tier.client_clock = client
    return on_redis, Limiter(rate, store=memory, name=name, **options)  # type: ignore[arg-type]


def drive(tz: str, day: str, hit: Callable[[float], None]) -> None:
    for at in instants(tz, day):
        hit(at)


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("rate", ["3/day", "4/week", "5/month", "6/year"])
@pytest.mark.parametrize(("tz", "day"), CASES)
def test_one_script_equals_python(
    redis_single: RedisServer, closing: contextlib.ExitStack, *, tz: str, day: str, rate: str,
    offset: float,
) -> None:  # fmt: skip
    server, client = FakeClock(), FakeClock()
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE, clock=server))
    on_redis, on_memory = pair(store, MemoryStore(clock=server), client, rate, tz)

    def hit(at: float) -> None:
        server.now_ns, client.now_ns = round(at * 1e9), round((at + offset) * 1e9)
        compare(on_redis.hit("k"), on_memory.hit("k"), at)
        compare(on_redis.peek("k"), on_memory.peek("k"), at)

    drive(tz, day, hit)


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize(("tz", "day"), CASES)
def test_many_script_equals_python(
    redis_single: RedisServer, closing: contextlib.ExitStack, tz: str, day: str, offset: float
) -> None:
    """Two calendar tiers and an epoch-aligned one in one _many.lua call."""
    server, client = FakeClock(), FakeClock()
    store = closing.enter_context(RedisStore(redis_single.url, timeout=LIVE, clock=server))
    memory = MemoryStore(clock=server)
    daily, daily_m = pair(store, memory, client, "3/day", tz)
    monthly, monthly_m = pair(store, memory, client, "5/month", tz)
    hourly, hourly_m = pair(store, memory, client, "100/hour", None)

    def hit(at: float) -> None:
        server.now_ns, client.now_ns = round(at * 1e9), round((at + offset) * 1e9)
        redis = hit_many([(daily, "k"), (monthly, "k"), (hourly, "k")])
        memory = hit_many([(daily_m, "k"), (monthly_m, "k"), (hourly_m, "k")])
        compare(redis, memory, at)
        assert redis.rule == memory.rule

    drive(tz, day, hit)


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize(("tz", "day"), CASES)
def test_batch_script_equals_python(
    redis_single: RedisServer, tz: str, day: str, offset: float
) -> None:
    """The asyncio store on one node: concurrent checks in one _batch.lua call."""

    async def main() -> None:
        server, client = FakeClock(), FakeClock()
        async with AsyncRedisStore(redis_single.url, timeout=LIVE, clock=server) as store:
            name = f"cal{uuid.uuid4().hex[:8]}"
            on_redis = AsyncLimiter("3/day", calendar=tz, store=store, name=name)
            on_redis._tier.client_clock = client
            memory = AsyncLimiter(
                "3/day", calendar=tz, store=AsyncMemoryStore(clock=server), name=name
            )
            for at in instants(tz, day):
                server.now_ns, client.now_ns = round(at * 1e9), round((at + offset) * 1e9)
                redis = await asyncio.gather(*(on_redis.hit(k) for k in ("a", "b", "a")))
                expected = [await memory.hit(k) for k in ("a", "b", "a")]
                for got, want in zip(redis, expected, strict=True):
                    compare(got, want, at)

    asyncio.run(main())


@pytest.mark.parametrize("offset", [-299.0, 299.0])
@pytest.mark.parametrize(("tz", "day"), CASES[::2])
def test_cluster_equals_python(
    redis_6_nodes: RedisCluster, closing: contextlib.ExitStack, tz: str, day: str, offset: float
) -> None:
    """On a cluster, keys hashed as for any limit: each check its own _one.lua call,
    hit_many's tiers in one call when they share a hash tag."""
    server, client = FakeClock(), FakeClock()
    store = closing.enter_context(RedisStore(redis_6_nodes.url, timeout=LIVE, clock=server))
    memory = MemoryStore(clock=server)
    daily, daily_m = pair(store, memory, client, "3/day", tz)
    monthly, monthly_m = pair(store, memory, client, "5/month", tz)

    def hit(at: float) -> None:
        server.now_ns, client.now_ns = round(at * 1e9), round((at + offset) * 1e9)
        for key in ("a", "b", "c"):
            compare(daily.hit(key), daily_m.hit(key), at)
        redis = hit_many([(daily, "{u}"), (monthly, "{u}")])
        compare(redis, hit_many([(daily_m, "{u}"), (monthly_m, "{u}")]), at)

    drive(tz, day, hit)


@given(
    tz=st.sampled_from(sorted(DAYS)),
    rate=st.sampled_from(["2/day", "3/week", "4/month", "5/year"]),
    week_start=st.sampled_from(WEEKDAYS),
    instant=st.integers(1_672_531_200, 1_798_675_200),  # 2023 .. 2026
    near=st.integers(-900_000, 900_000),  # ms from the end of the period holding instant
    offset=st.integers(-299_000, 299_000),  # ms, within the skew
    gaps=st.lists(
        st.one_of(st.integers(0, 600_000), st.integers(0, 3 * 86400_000)), min_size=1, max_size=12
    ),  # ms
)
def test_random_instants_equal_python(
    redis_single: RedisServer, *, tz: str, rate: str, week_start: str, instant: int, near: int,
    offset: int, gaps: list[int],
) -> None:  # fmt: skip
    """Around any period's end in four years, any week start, the client any way
    within the skew."""
    week_start = week_start if rate.endswith("week") else "monday"
    unit = rate.split("/")[1]
    end = Calendar(tz, unit, week_start).window(instant * 1_000_000_000)[1]
    server, client = FakeClock(), FakeClock()
    server.now_ns = end + near * 1_000_000
    name = f"cal{uuid.uuid4().hex[:8]}"
    options = {"calendar": tz, "week_start": week_start}
    with RedisStore(redis_single.url, timeout=LIVE, clock=server) as store:
        on_redis = Limiter(rate, store=store, name=name, **options)  # type: ignore[arg-type]
        on_redis._tier.client_clock = client
        memory = Limiter(rate, store=MemoryStore(clock=server), name=name, **options)  # type: ignore[arg-type]
        for gap in gaps:
            server.now_ns += gap * 1_000_000
            client.now_ns = server.now_ns + offset * 1_000_000
            at = server.now_ns / 1e9
            compare(on_redis.hit("k"), memory.hit("k"), at)

"""Region splits on real Redis servers: three regions, each its own redis-server,
and a home for the coordinator, all on one fake clock (sent to every script)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from ratewarden import FakeClock
from ratewarden.fleet import RegionalLimiter, RegionRebalancer, RegionSplit
from ratewarden.stores.redis import RedisStore
from tests.redis_server import RedisServer, redis_server

START = 1_763_900_000.0  # a window edge
REGIONS = ("us", "eu", "ap")


@pytest.fixture(scope="module")
def servers() -> Iterator[list[RedisServer]]:
    """Three regional Redis servers and a home."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(redis_server()) for _ in range(4)]


@pytest.fixture
def name() -> str:
    return f"split-{uuid.uuid4().hex[:8]}"


@dataclass
class Region:
    name: str
    limiter: RegionalLimiter
    rebalancer: RegionRebalancer | None
    phase: int  # ms into each second when it rebalances
    owed: float = 0.0
    admitted: dict[int, int] = field(default_factory=dict)  # per window


def regions(split: RegionSplit, servers: list[RedisServer], clock: FakeClock) -> dict[str, Region]:
    home = servers[3].client()
    out = {}
    for i, region in enumerate(REGIONS):
        client = servers[i].client()
        store = RedisStore(client, clock=clock)
        limiter = RegionalLimiter(split, region, store, clock=clock)
        rebalancer = (
            RegionRebalancer(split, region, client, home, clock=clock) if split.dynamic else None
        )
        out[region] = Region(region, limiter, rebalancer, phase=100 + 330 * i)
    return out


def drive(
    split: RegionSplit,
    places: dict[str, Region],
    clock: FakeClock,
    demand: dict[str, int],
    seconds: int,
) -> list[int]:
    """Requests arriving evenly at ``demand`` per second per region for ``seconds``,
    in 10 ms steps; each second, each rebalancer ticks at its phase. Every step,
    the regional limits in force must sum to at most the total. The sums of
    those limits, one per step."""
    sums = []
    for _ in range(seconds * 100):
        now = clock.time_ns()
        ms = now // 1_000_000
        for place in places.values():
            if place.rebalancer is not None and ms % 1000 == place.phase:
                place.rebalancer.tick()
        for place in places.values():
            place.owed += demand[place.name] / 100
            while place.owed >= 1:
                place.owed -= 1
                if place.limiter.hit("provider"):
                    window = ms // 1000
                    place.admitted[window] = place.admitted.get(window, 0) + 1
        limits = sum(place.limiter.refresh(now) for place in places.values())
        assert limits <= split.rate.limit, (ms, {p.name: p.limiter.limit for p in places.values()})
        sums.append(limits)
        clock.advance(0.01)
    return sums


def utilisation(places: dict[str, Region], windows: range, room: int) -> float:
    admitted = sum(p.admitted.get(w, 0) for p in places.values() for w in windows)
    return admitted / (room * len(windows))


def test_dynamic_split_follows_a_10_to_1_skew_and_its_shift(
    servers: list[RedisServer], name: str
) -> None:
    """500/s over three regions demanding 500:50:50, then 50:500:50. Dynamic
    rebalancing uses at least 97% of the global limit once settled, and settles
    within 3 s of the shift; equal static shares use about half."""
    first = {"us": 500, "eu": 50, "ap": 50}
    then = {"us": 50, "eu": 500, "ap": 50}
    clock = FakeClock(START)
    split = RegionSplit(name, "500/second", dict.fromkeys(REGIONS, 1))
    places = regions(split, servers, clock)
    drive(split, places, clock, first, 8)
    drive(split, places, clock, then, 8)
    base = int(START)
    assert utilisation(places, range(base + 3, base + 8), 500) >= 0.97
    assert utilisation(places, range(base + 11, base + 16), 500) >= 0.97
    assert places["eu"].limiter.limit >= 390  # 500 - 50 - 50, but for rounding
    assert utilisation(places, range(base + 8, base + 11), 500) < 0.97  # it takes a moment

    static_split = RegionSplit(
        f"{name}-static", "500/second", dict.fromkeys(REGIONS, 1), dynamic=False
    )
    clock = FakeClock(START)
    static = regions(static_split, servers, clock)
    sums = drive(static_split, static, clock, first, 4)
    assert set(sums) == {3 * 166}
    assert 0.5 < utilisation(static, range(base, base + 4), 500) < 0.56  # (166+50+50)/500


def test_a_lower_limit_applies_to_the_window_under_way(
    servers: list[RedisServer], name: str
) -> None:
    """Counts carry over a change of the limit: 8 admitted under 10, then the
    limit drops to 5: denied for the rest of the window; the next one admits 5."""
    clock = FakeClock(START)
    split = RegionSplit(name, "30/second", dict.fromkeys(REGIONS, 1), poll=0.1)
    client = servers[0].client()
    limiter = RegionalLimiter(split, "us", RedisStore(client, clock=clock), clock=clock)
    limit_key, demand_key = split.keys()
    now_ms = int(START * 1000)
    client.hset(
        limit_key,
        mapping={"limit": 10, "next": 0, "next_ms": 0, "until_ms": now_ms + 5000, "lease_ms": 5000},
    )
    assert [bool(limiter.hit("k")) for _ in range(8)] == [True] * 8
    assert limiter.limit == 10
    client.hset(limit_key, "limit", 5)
    clock.advance(0.05)
    assert limiter.hit("k")  # not polled yet: the old limit holds for up to a poll
    clock.advance(0.05)
    decision = limiter.hit("k")
    assert (decision.allowed, decision.limit, limiter.limit) == (False, 5, 5)
    clock.advance(0.9)
    assert [bool(limiter.hit("k")) for _ in range(6)] == [True] * 5 + [False]
    counts = client.hgetall(demand_key)
    assert (int(counts[b"asked"]), int(counts[b"used"])) == (10, 9)  # flushed at the polls
    client.hset(limit_key, "limit", 0)
    clock.advance(0.1)
    zero = limiter.hit("k")
    assert (zero.allowed, zero.limit) == (False, 0)
    assert zero.retry_after == pytest.approx(0.9)  # the next window edge


def test_without_the_home_a_region_keeps_its_grant_then_falls_to_its_static_share(
    servers: list[RedisServer], name: str
) -> None:
    with redis_server() as home:
        clock = FakeClock(START)
        split = RegionSplit(name, "300/second", dict.fromkeys(REGIONS, 1), lease=2.0)
        client = servers[0].client()
        limiters, rebalancers = {}, {}
        for i, region in enumerate(REGIONS):
            regional = servers[i].client()
            limiters[region] = RegionalLimiter(
                split, region, RedisStore(regional, clock=clock), clock=clock
            )
            rebalancers[region] = RegionRebalancer(split, region, regional, home.url, clock=clock)
        for _ in range(3):  # us asks for 250 a second; the others for 10
            for region, rebalancer in rebalancers.items():
                for _ in range(250 if region == "us" else 10):
                    limiters[region].hit("k")
                clock.advance(0.1)
                limiters[region].refresh()
                rebalancer.tick()
            clock.advance(0.7)
        us = limiters["us"]
        assert us.refresh() >= 250
        granted = us.limit
        assert repr(rebalancers["us"]).startswith(f"RegionRebalancer({name!r}, region='us'")
        home.kill()
        assert rebalancers["us"].tick() is None  # the home does not answer
        record = rebalancers["us"].record
        assert record is not None
        assert client.hget(split.keys()[0], "until_ms") == str(record.until_ms).encode()
        clock.set(record.until_ms / 1000 - 0.01)
        assert us.refresh() == granted  # while the lease lasts
        clock.set(record.until_ms / 1000)
        assert us.refresh() == 100  # min(static, grant) for one more lease
        low = limiters["eu"]
        low_record = rebalancers["eu"].record
        assert low_record is not None
        clock.set(low_record.until_ms / 1000 + 0.1)
        assert low.refresh() < 100  # its last grant was smaller than its static share
        clock.set((record.until_ms + record.lease_ms) / 1000 + 1)
        assert us.refresh() == 100
        assert low.refresh() == 100  # then the static share, from a window edge
        assert "limit=100/1s" in repr(us)

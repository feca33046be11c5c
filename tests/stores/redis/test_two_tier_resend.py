"""A two-tier call whose reply is lost is sent again, as it was, under the same id,
and `_sync.lua` applies it once: whether the first send landed (a timeout with the
call in flight) or not, every hit is counted once. The ids expire, and on a
cluster each lands in the slot of its call's keys.

Determinism as in test_two_tier_attack: a fake clock drives the scripts' time and
the sync threads are stopped, so that syncs happen when a test says.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from ratewarden import Limiter, StoreUnavailable
from ratewarden._clock import FakeClock
from ratewarden.stores.failure import Breaker, LocalFallback
from ratewarden.stores.redis import RedisStore, TwoTierSettings
from ratewarden.stores.redis._twotier_core import Engine
from tests.redis_server import LIVE, RedisCluster, RedisServer
from tests.stores.redis.test_two_tier_attack import FAST, START, entry, fresh, manual, sync, used

RATE = "100000/hour"
LOST = "redis: no answer within the timeout (0.05s)"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def made() -> Iterator[list[RedisStore]]:
    stores: list[RedisStore] = []
    yield stores
    for s in stores:
        s.close()


def two_tier(made: list[RedisStore], url: str, clock: FakeClock) -> tuple[RedisStore, Limiter]:
    s = RedisStore(url, clock=clock, two_tier=FAST, timeout=LIVE)
    made.append(s)
    limiter = Limiter(RATE, store=s, name=fresh(), algorithm="fixed_window", two_tier=True)
    return s, limiter


def warm(s: RedisStore, limiter: Limiter, clock: FakeClock, keys: list[str]) -> int:
    """Rounds of hits and syncs until the keys' checks pass here; the hits passed."""
    manual(s)
    admitted = 0
    for _ in range(10):
        for key in keys:
            admitted += sum(limiter.hit(key).allowed for _ in range(20))
        clock.advance(0.05)
        sync(s)
    return admitted


class Lossy:
    """Wraps an engine's script call: while armed, each call's reply is lost, after
    Redis ran it (``landed``) or before it reached Redis. Records every call."""

    def __init__(self, s: RedisStore, *, landed: bool) -> None:
        assert s._local is not None
        self.engine = s._local
        self.real = self.engine.call
        self.landed = landed
        self.armed = True
        self.calls: list[tuple[str, int, list[Any]]] = []
        self.engine.call = self

    def __call__(self, script: str, numkeys: int, args: list[Any]) -> Any:
        self.calls.append((script, numkeys, list(args)))
        if not self.armed:
            return self.real(script, numkeys, args)
        if self.landed:
            self.real(script, numkeys, args)
        raise StoreUnavailable(LOST)


def count(url: str, clock: FakeClock, limiter: Limiter, key: str) -> int:
    assert limiter.name is not None
    return used(url, clock, limiter.name, RATE, key, "fixed_window")


@pytest.mark.parametrize("landed", [True, False], ids=["reply-lost-after", "call-lost-before"])
def test_a_sync_sent_again_counts_once(
    redis_single: RedisServer, made: list[RedisStore], clock: FakeClock, landed: bool
) -> None:
    """The lost call is sent again with the same keys, id and deltas; hits passed
    meanwhile follow in the same sync; Redis counts each hit once."""
    s, limiter = two_tier(made, redis_single.url, clock)
    admitted = warm(s, limiter, clock, ["k"])
    admitted += sum(limiter.hit("k").allowed for _ in range(30))
    lossy = Lossy(s, landed=landed)
    sync(s)
    assert count(redis_single.url, clock, limiter, "k") == admitted - (0 if landed else 30)
    assert entry(s, "k").pending
    later = sum(limiter.hit("k").allowed for _ in range(7))  # they wait for the resend
    lossy.armed = False
    sync(s)
    assert count(redis_single.url, clock, limiter, "k") == admitted + later
    assert not entry(s, "k").pending
    (_, n, first), (_, n_again, again), (_, _, newer) = lossy.calls
    # the keys, the id key and the payload as the first time (only the time is new)
    assert (n, first[:n], first[n + 1 :]) == (n_again, again[:n], again[n + 1 :])
    assert newer[n - 1] != first[n - 1]  # the later hits: a call of their own
    assert struct.unpack(">d", newer[n + 1][8:16]) == (7.0,)
    assert not s._local.unsent()[0]  # type: ignore[union-attr]


def test_a_resend_that_fails_again_keeps_its_id(
    redis_single: RedisServer, made: list[RedisStore], clock: FakeClock
) -> None:
    """Lost after landing, then lost again before landing, then answered: counted
    once, and the hits passed meanwhile follow it."""
    s, limiter = two_tier(made, redis_single.url, clock)
    admitted = warm(s, limiter, clock, ["k"])
    admitted += sum(limiter.hit("k").allowed for _ in range(30))
    lossy = Lossy(s, landed=True)
    sync(s)
    lossy.landed = False
    admitted += sum(limiter.hit("k").allowed for _ in range(5))
    clock.advance(0.01)
    sync(s)
    assert len({args[numkeys - 1] for _, numkeys, args in lossy.calls}) == 1
    lossy.armed = False
    clock.advance(0.01)
    sync(s)
    assert count(redis_single.url, clock, limiter, "k") == admitted
    assert not s._local.unsent()[0]  # type: ignore[union-attr]
    assert not entry(s, "k").pending


def test_an_exact_check_whose_reply_is_lost_counts_its_hits_once(
    redis_single: RedisServer, made: list[RedisStore], clock: FakeClock
) -> None:
    """A check that goes to Redis carries the key's unsent hits: its reply lost, the
    policy answers it (here: raise) and the hits are sent again under its id. Redis,
    having run it, counted the check's cost too: that is the store's one hit in
    doubt, as with any check whose reply is lost; the hits are not counted twice."""
    s, limiter = two_tier(made, redis_single.url, clock)
    admitted = warm(s, limiter, clock, ["k"])
    e = entry(s, "k")
    before = sum(limiter.hit("k").allowed for _ in range(5))
    assert e.delta == before
    big = e.allowance + e.leased + 1  # more than this process may pass: Redis decides
    lossy = Lossy(s, landed=True)
    with pytest.raises(StoreUnavailable):
        limiter.hit("k", big)
    lossy.armed = False
    s.breaker.succeeded()
    sync(s)
    assert count(redis_single.url, clock, limiter, "k") == admitted + before + big


def test_call_ids_expire(
    redis_single: RedisServer, made: list[RedisStore], clock: FakeClock
) -> None:
    """Every id key is set with a time to live (by default 10 s, or 20 sync
    intervals), and is gone after it: the ids in Redis are bounded by the calls of
    one such span, however long the store syncs."""
    assert (
        Engine(TwoTierSettings(), Breaker(), None, None, fallback=LocalFallback(1, None)).id_ttl_ms
        == 10_000
    )
    s, limiter = two_tier(made, redis_single.url, clock)
    assert s._local is not None
    assert s._local.id_ttl_ms == 10_000
    s._local.id_ttl_ms = 200
    pattern = f"*:ratewarden:call:{s._local.id_prefix}:*"
    warm(s, limiter, clock, [f"k{i}" for i in range(5)])
    with redis_single.client() as client:
        keys = list(client.scan_iter(match=pattern, count=1000))
        assert len(keys) >= 10  # the syncs' calls, and the checks' that went to Redis
        assert all(0 < client.pttl(key) <= 200 for key in keys)
        deadline = time.monotonic() + 5  # Redis expires them within a few of its cycles
        while list(client.scan_iter(match=pattern, count=1000)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not list(client.scan_iter(match=pattern, count=1000))


def test_on_a_cluster_each_id_lands_in_its_calls_slot(
    redis_6_nodes: RedisCluster, made: list[RedisStore], clock: FakeClock
) -> None:
    """Keys over many slots, with hash tags and with a ``}`` that cannot be a tag:
    every call's id key hashes to its keys' slot (a cluster refuses a script whose
    keys span slots), and a sync lost after landing counts once there too."""
    s, limiter = two_tier(made, redis_6_nodes.url, clock)
    keys = [f"k{i}" for i in range(40)] + ["{user:7}:a", "a}b", "x{}y", "}{z}"]
    admitted = warm(s, limiter, clock, keys)
    assert count(redis_6_nodes.url, clock, limiter, "a}b") == admitted // len(keys)
    for key in keys:
        assert limiter.hit(key).allowed
    lossy = Lossy(s, landed=True)
    sync(s)
    lossy.armed = False
    sync(s)
    assert len(lossy.calls) >= 2 * len({key_slot(f"{s._local.limits[0].prefix}{k}".encode())  # type: ignore[union-attr]
                                        for k in keys})  # fmt: skip
    for _, numkeys, args in lossy.calls:
        slots = {key_slot(k.encode()) for k in args[:numkeys]}
        assert len(slots) == 1, args[:numkeys]
    for key in keys:
        assert count(redis_6_nodes.url, clock, limiter, key) == admitted // len(keys) + 1


@settings(max_examples=300, deadline=None)
@given(key=st.text(alphabet="ab{}:", max_size=8))
def test_an_id_key_hashes_as_its_calls_first_key(key: str) -> None:
    def keyslot(k: str) -> int:
        return key_slot(k.encode())

    engine = Engine(TwoTierSettings(), Breaker(), None, keyslot, fallback=LocalFallback(1, None))
    assert keyslot(engine.id_key(key)) == keyslot(key)

from __future__ import annotations

import pytest

from ratewarden import ConfigurationError, FakeClock, Limiter, MemoryStore


def test_peek_counts_nothing_and_reset_forgets() -> None:
    limiter = Limiter("2/minute", algorithm="fixed_window", store=MemoryStore(clock=FakeClock()))
    assert limiter.peek("k").remaining == 2
    assert limiter.peek("k").reset_after == 0
    assert limiter.peek("k", 3).retry_after == float("inf")
    limiter.hit("k")
    assert limiter.peek("k").remaining == 1
    assert limiter.peek("k").remaining == 1
    assert not limiter.peek("k", 2).allowed
    limiter.hit("k")
    assert not limiter.peek("k").allowed
    limiter.reset("k")
    assert limiter.hit("k").remaining == 1


def test_limiters_sharing_a_store_keep_their_keys_apart() -> None:
    store = MemoryStore(clock=FakeClock())
    per_minute = Limiter("2/minute", algorithm="fixed_window", store=store)
    bucket = Limiter("2/minute", algorithm="token_bucket", store=store)
    login = Limiter("1/minute", algorithm="fixed_window", store=store, name="login")
    for _ in range(2):
        assert per_minute.hit("u").allowed
    assert bucket.hit("u").allowed
    assert login.hit("u").allowed
    assert not login.hit("u").allowed
    # the same limit on the same store is the same counter
    assert not Limiter("2/minute", algorithm="fixed_window", store=store).hit("u").allowed
    assert len(store) == 3


def test_full_keys_are_swept_away() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    limiter = Limiter("10/second", algorithm="token_bucket", store=store)
    for i in range(5000):
        limiter.hit(f"old{i}")
    clock.advance(1.0)  # every old bucket is full again
    for i in range(5000):
        limiter.hit(f"new{i}")  # growth triggers sweeps of what is full
    assert len(store) <= 5000  # the old ones went while the new ones came in
    clock.advance(1.0)
    left = len(store)
    assert store.sweep() == left
    assert len(store) == 0


def test_explicit_sweep_keeps_live_keys() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    minute = Limiter("10/minute", algorithm="fixed_window", store=store)
    second = Limiter("10/second", algorithm="sliding_window_log", store=store)
    clock.set(1_700_000_040)  # 20 s before the minute's edge
    minute.hit("a")
    second.hit("b")
    clock.advance(1.0)
    assert store.sweep() == 1
    assert minute.peek("a").remaining == 9


def test_max_keys_evicts_least_recently_used() -> None:
    store = MemoryStore(max_keys=1000, clock=FakeClock())
    limiter = Limiter("5/minute", algorithm="fixed_window", store=store)
    for i in range(1000):
        limiter.hit(f"k{i}")
    limiter.hit("k0")  # k0 is now the most recently used
    for i in range(1000, 1500):
        limiter.hit(f"k{i}")
        assert len(store) <= 1000
    assert limiter.peek("k0").remaining == 3  # kept its count
    assert limiter.peek("k1").remaining == 5  # evicted: starts afresh
    assert store.evicted >= 500


def test_at_the_bound_full_keys_go_before_live_ones() -> None:
    clock = FakeClock()
    store = MemoryStore(max_keys=1000, clock=clock)
    daily = Limiter("5/day", algorithm="fixed_window", store=store, name="daily")
    burst = Limiter("10/second", algorithm="token_bucket", store=store, name="burst")
    for i in range(500):
        daily.hit(f"d{i}")  # live all day, and the least recently used
    for round_ in range(6):  # 500 live + 400 live fit; the full ones must make room
        for i in range(400):
            burst.hit(f"b{round_}-{i}")
            assert len(store) <= 1000
        clock.advance(1.0)  # the burst keys are full again: worth nothing
    assert store.evicted == 0
    assert all(daily.peek(f"d{i}").remaining == 4 for i in range(500))


def test_limits_sharing_a_bounded_store_give_up_keys_in_proportion() -> None:
    store = MemoryStore(max_keys=1000, clock=FakeClock())
    big = Limiter("5/minute", algorithm="fixed_window", store=store, name="big")
    small = Limiter("5/minute", algorithm="token_bucket", store=store, name="small")
    for i in range(900):
        big.hit(f"b{i}")
    for i in range(100):
        small.hit(f"s{i}")
    assert len(store) == 1000
    small.hit("newest")  # overflows: both limits give up their oldest keys
    assert len(store) <= 1000
    assert small.peek("newest").remaining == 4  # the key just hit is never the one evicted
    assert big.peek("b0").remaining == 5  # least recently used: gone
    assert small.peek("s0").remaining == 5
    assert big.peek("b899").remaining == 4  # recent ones stay
    # 1% of the bound is 10 of 1001 keys: floor(900 * 10/1001) = 8 from big and
    # floor(101 * 10/1001) = 1 from small, and the one left over from the larger
    assert store.evicted == 10
    assert big.peek("b8").remaining == 5
    assert big.peek("b9").remaining == 4
    assert small.peek("s1").remaining == 4


@pytest.mark.slow
def test_a_million_keys_stay_bounded() -> None:
    store = MemoryStore(max_keys=100_000, clock=FakeClock())
    limiter = Limiter("100/minute", algorithm="fixed_window", store=store)
    high = 0
    for i in range(1_000_000):
        limiter.hit(str(i))
        if i % 1000 == 0:
            high = max(high, len(store))
    assert high <= 100_000
    assert 99_000 <= len(store) <= 100_000


@pytest.mark.parametrize("cost", [0, -1, 1.5, "1", None, True])
def test_bad_cost_is_a_configuration_error(cost: object) -> None:
    limiter = Limiter("5/minute")
    with pytest.raises(ConfigurationError, match="cost"):
        limiter.hit("k", cost)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="cost"):
        limiter.peek("k", cost)  # type: ignore[arg-type]


@pytest.mark.parametrize("max_keys", [0, -5, 1.5, "10"])
def test_bad_max_keys(max_keys: object) -> None:
    with pytest.raises(ConfigurationError, match="max_keys"):
        MemoryStore(max_keys=max_keys)  # type: ignore[arg-type]


def test_repr_shows_state() -> None:
    store = MemoryStore(max_keys=10, clock=FakeClock(1_700_000_000))
    Limiter("5/minute", store=store).hit("a")
    assert repr(store) == (
        "<MemoryStore keys=1, max_keys=10, clock=FakeClock(now=1700000000.000000000)>"
    )

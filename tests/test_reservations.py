"""`Limiter.reserve` and `AsyncLimiter.reserve` on the memory and Redis stores:
admitted as a hit, settled or cancelled once, charged at the estimate when left
alone, bad input refused with nothing lost, estimates learned per profile."""

from __future__ import annotations

import asyncio
import gc
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ratewarden import (
    Adaptive,
    AsyncLimiter,
    AsyncMemoryStore,
    ConfigurationError,
    Estimates,
    FakeClock,
    Limiter,
    MemoryStore,
    ReservationError,
    StoreUnavailable,
)
from tests.redis_server import LIVE, RedisServer, free_port

KINDS = ["memory", "memory-async", "redis", "redis-async"]
ALGORITHMS = [
    "fixed_window", "sliding_window_counter", "sliding_window_log", "token_bucket",
    "leaky_bucket", "gcra",
]  # fmt: skip


class Sync:
    """An async reservation or limiter driven from a test, on one event loop."""

    def __init__(self, target: Any, runner: asyncio.Runner | None) -> None:
        self.target, self.runner = target, runner

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.target, name)
        if self.runner is None or not callable(value):
            return value
        runner = self.runner

        def call(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            if asyncio.iscoroutine(result):
                result = runner.run(result)
            if hasattr(result, "settle"):  # a reservation: drive it the same way
                return Sync(result, runner)
            return result

        return call

    def __bool__(self) -> bool:
        return bool(self.target)


class Kit:
    """Makes limiters of one kind (store, sync or async) on one fake clock."""

    def __init__(self, kind: str, clock: FakeClock, redis: RedisServer | None) -> None:
        self.kind, self.clock, self.redis = kind, clock, redis
        self.runner = asyncio.Runner() if kind.endswith("async") else None
        self.stores: list[Any] = []

    def limiter(self, rate: str, **options: Any) -> Any:
        options.setdefault("name", uuid.uuid4().hex[:8])
        if self.kind == "memory":
            return Sync(Limiter(rate, store=MemoryStore(clock=self.clock), **options), None)
        if self.kind == "memory-async":
            store = AsyncMemoryStore(clock=self.clock)
            return Sync(AsyncLimiter(rate, store=store, **options), self.runner)
        from ratewarden.stores.redis import AsyncRedisStore, RedisStore  # noqa: PLC0415

        assert self.redis is not None
        if self.kind == "redis":
            sync_store = RedisStore(self.redis.url, clock=self.clock, timeout=LIVE)
            self.stores.append(sync_store)
            return Sync(Limiter(rate, store=sync_store, **options), None)
        assert self.runner is not None

        async def make() -> Any:
            return AsyncRedisStore(self.redis.url, clock=self.clock, timeout=LIVE)  # type: ignore[union-attr]

        async_store = self.runner.run(make())
        self.stores.append(async_store)
        return Sync(AsyncLimiter(rate, store=async_store, **options), self.runner)

    def close(self) -> None:
        for store in self.stores:
            if self.runner is not None:
                self.runner.run(store.aclose())
            else:
                store.close()
        if self.runner is not None:
            self.runner.close()


@pytest.fixture(params=KINDS)
def kit(request: pytest.FixtureRequest) -> Iterator[Kit]:
    redis = request.getfixturevalue("redis_single") if "redis" in request.param else None
    made = Kit(request.param, FakeClock(1_700_000_000.25), redis)
    yield made
    made.close()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_settle_charges_or_refunds_the_difference(kit: Kit, algorithm: str) -> None:
    limiter = kit.limiter("100/minute", algorithm=algorithm)
    r = limiter.reserve("k", cost=50)
    assert r
    assert r.allowed
    assert r.remaining == 50
    r.settle(10)  # 40 back
    assert limiter.peek("k").remaining == 90
    assert r.state == "settled"
    limiter.reserve("k", cost=30).cancel()
    assert limiter.peek("k").remaining == 90
    limiter.reserve("k", cost=30).settle(70)  # 40 more
    assert limiter.peek("k").remaining == 20


def test_admitted_or_denied_as_a_hit(kit: Kit) -> None:
    limiter = kit.limiter("100/minute", algorithm="token_bucket")
    assert limiter.reserve("k", cost=60).remaining == 40
    would = limiter.peek("k", 50)
    r = limiter.reserve("k", cost=50)
    assert not r
    assert r.decision == would
    assert r.state == "denied"
    assert r.retry_after == would.retry_after > 0
    assert limiter.reserve("k", cost=101).retry_after == float("inf")
    with pytest.raises(ReservationError, match="denied"):
        r.settle(10)
    with pytest.raises(ReservationError, match="denied"):
        r.cancel()
    assert limiter.peek("k").remaining == 40  # nothing counted, nothing refunded


def test_a_reservation_left_alone_stays_charged_at_its_estimate(kit: Kit) -> None:
    """No settle, no cancel, the object dropped and collected: the estimate
    stays charged, and goes only as the limit's own time lets it."""
    limiter = kit.limiter("100/minute", algorithm="fixed_window")
    r = limiter.reserve("k", cost=30)
    del r
    gc.collect()
    assert limiter.peek("k").remaining == 70
    kit.clock.advance(30)
    gc.collect()
    assert limiter.peek("k").remaining == 70
    kit.clock.advance(60)  # the next minute
    assert limiter.peek("k").remaining == 100


def test_bad_input_is_refused_and_loses_nothing(kit: Kit) -> None:
    limiter = kit.limiter("100/minute", algorithm="sliding_window_counter")
    for estimate in (0, -1, 1.5, True, "3"):
        with pytest.raises(ConfigurationError, match="positive integer"):
            limiter.reserve("k", cost=estimate)
    with pytest.raises(ConfigurationError, match="cost=<estimate> or profile"):
        limiter.reserve("k")
    assert limiter.peek("k").remaining == 100
    r = limiter.reserve("k", cost=40)
    for actual in (-1, 2.5, True, None, "10"):
        with pytest.raises(ReservationError, match="whole number >= 0"):
            r.settle(actual)
    assert r.state == "open"
    assert limiter.peek("k").remaining == 60
    r.settle(10)  # still usable: nothing was lost
    assert limiter.peek("k").remaining == 90
    with pytest.raises(ReservationError, match="is settled"):
        r.settle(10)
    with pytest.raises(ReservationError, match="is settled"):
        r.cancel()
    c = limiter.reserve("k", cost=5)
    c.cancel()
    with pytest.raises(ReservationError, match="is cancelled"):
        c.settle(1)
    assert limiter.peek("k").remaining == 90


def test_a_refund_after_its_window_passed_is_void(kit: Kit) -> None:
    limiter = kit.limiter("100/minute", algorithm="fixed_window")
    kit.clock.set(1_700_000_080)  # 20 s into a minute (1_700_000_040 starts one)
    r = limiter.reserve("k", cost=80)
    kit.clock.advance(45)  # 5 s into the next minute
    assert limiter.reserve("k", cost=10)
    r.settle(0)  # its minute is over: nothing comes back
    assert limiter.peek("k").remaining == 90
    limiter.reserve("k", cost=10).settle(30)  # an over-run counts in this minute
    assert limiter.peek("k").remaining == 60


def test_a_bucket_over_run_delays_later_callers(kit: Kit) -> None:
    limiter = kit.limiter("60/minute", algorithm="gcra")  # a token a second
    limiter.reserve("k", cost=60).settle(90)  # 30 tokens of debt
    decision = limiter.peek("k")
    assert not decision.allowed
    assert decision.remaining == 0
    assert decision.retry_after == 31.0
    kit.clock.advance(31)
    assert limiter.reserve("k", cost=1)


def test_estimates_learn_a_profiles_p95(kit: Kit) -> None:
    limiter = kit.limiter(
        "1000000000/minute", estimates=Estimates(ceiling=5000, floor=20, quantile=0.95)
    )
    first = limiter.reserve("k", profile="chat")
    assert first.estimate == 5000  # no history: the worst case
    first.settle(100)
    for actual in range(1, 101):  # 1..100
        limiter.reserve("k", profile="chat").settle(actual)
    assert limiter.reserve("k", profile="chat").estimate == 96  # nearest rank of 101 values
    for _ in range(200):
        limiter.reserve("k", profile="tiny").settle(3)
    assert limiter.reserve("k", profile="tiny").estimate == 20  # the floor
    cancelled = limiter.reserve("k", profile="tiny")
    cancelled.cancel()  # a cancel is not a settle: it teaches nothing
    assert limiter.learned.estimate("tiny") == 20
    for _ in range(3):
        limiter.reserve("k", profile="big").settle(10**6)
    assert limiter.reserve("k", profile="big").estimate == 5000  # the ceiling
    assert limiter.reserve("k", cost=7, profile="chat").estimate == 7  # a cost wins


def test_learned_memory_stays_bounded() -> None:
    limiter = Limiter(
        "1000000/minute",
        store=MemoryStore(clock=FakeClock()),
        estimates=Estimates(ceiling=100, size=4, profiles=3),
    )
    for actual in (90, 80, 1, 2, 3, 4):
        limiter.reserve("k", profile="a").settle(actual)
    assert limiter.reserve("k", profile="a").estimate == 4  # only the last 4 count
    for name in ("b", "c", "d"):
        limiter.reserve("k", profile=name).settle(5)
    assert limiter.learned is not None
    assert len(limiter.learned._rings) == 3  # "a", least recently used, forgotten
    assert limiter.learned.estimate("a") == 100
    assert limiter.learned.estimate("d") == 5


def test_options_that_cannot_reserve_say_so() -> None:
    store = MemoryStore(clock=FakeClock())
    with pytest.raises(ConfigurationError, match="no shards, adaptive or two_tier"):
        Limiter(
            "10/second", store=store, adaptive=Adaptive(lambda: 0.0, good=0.1, bad=0.9)
        ).reserve("k", 1)
    with pytest.raises(ConfigurationError, match="estimates=Estimates"):
        Limiter("10/second", store=store).reserve("k", profile="chat")
    for bad in (
        {"ceiling": 0}, {"ceiling": 5, "floor": 6}, {"ceiling": 5, "quantile": 0},
        {"ceiling": 5, "quantile": 1.5}, {"ceiling": 5, "size": 0}, {"ceiling": 5, "profiles": -1},
    ):  # fmt: skip
        with pytest.raises(ConfigurationError, match="Estimates"):
            Estimates(**bad)


def test_a_failed_settle_keeps_the_reservation_open(monkeypatch: pytest.MonkeyPatch) -> None:
    limiter = Limiter("100/minute", store=MemoryStore(clock=FakeClock()))
    r = limiter.reserve("k", cost=50)
    held = limiter._reserver
    assert held is not None
    real = held.settle

    def down(*args: Any) -> None:
        raise StoreUnavailable("redis: down")

    monkeypatch.setattr(held, "settle", down)
    with pytest.raises(StoreUnavailable):
        r.settle(10)
    assert r.state == "open"
    monkeypatch.setattr(held, "settle", real)
    r.settle(10)
    assert limiter.peek("k").remaining == 90


def race(reservation: Any, start: threading.Barrier, wins: list[bool]) -> None:
    start.wait()
    try:
        reservation.settle(0)
        wins.append(True)
    except ReservationError:
        wins.append(False)


def test_one_settle_wins_a_race() -> None:
    limiter = Limiter("1000/minute", store=MemoryStore(clock=FakeClock()))
    for _ in range(50):
        r = limiter.reserve("k", cost=10)
        wins: list[bool] = []
        start = threading.Barrier(4)
        threads = [threading.Thread(target=race, args=(r, start, wins)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wins.count(True) == 1
    assert limiter.peek("k").remaining == 1000


def test_repr_shows_the_state() -> None:
    limiter = Limiter("100/minute", store=MemoryStore(clock=FakeClock()))
    r = limiter.reserve("user-1", cost=40)
    assert repr(r) == "<Reservation open key='user-1', estimate=40, remaining=60>"
    r.cancel()
    assert repr(r).startswith("<Reservation cancelled")


def test_a_change_that_raises_leaves_the_memory_state_as_it_was() -> None:
    """`MemoryStore.update` pops the key under ``max_keys`` (to keep its dict in
    least-recently-used order): a change that raises puts it back."""
    store = MemoryStore(clock=FakeClock(), max_keys=10)
    limiter = Limiter("100/minute", store=store)
    limiter.reserve("k", cost=30)

    def broken(state: Any, now: int) -> Any:
        raise RuntimeError("broken")

    with pytest.raises(RuntimeError):
        store.update(limiter._tier, "k", broken)
    assert limiter.peek("k").remaining == 70
    assert len(store) == 1


def test_a_degraded_admission_settles_to_nothing() -> None:
    """Redis is down and the limit fails open: the reservation is admitted,
    marked degraded, counted nowhere; its settle has nothing to change."""
    from ratewarden.stores.redis import RedisStore  # noqa: PLC0415

    with RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2) as store:
        limiter = Limiter("100/minute", store=store, on_failure="fail_open")
        r = limiter.reserve("k", cost=30)
        assert r
        assert r.decision.degraded
        r.settle(90)
        assert r.state == "settled"


def test_a_settle_counts_nothing_while_limiting_is_off(ratewarden: Any) -> None:
    """Under the pytest plugin's ``ratewarden.off()`` a reserve counts nothing,
    and so does its settle, over-run or refund."""
    limiter = Limiter("100/minute", store=MemoryStore())
    kept = limiter.reserve("k", cost=30)
    with ratewarden.off():
        limiter.reserve("k", cost=30).settle(500)
        kept.cancel()
    assert limiter.peek("k").remaining == 70


def test_on_redis_a_reserve_and_a_settle_are_one_script_call_each(
    redis_single: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ratewarden.stores.redis import RedisStore  # noqa: PLC0415

    with RedisStore(redis_single.url, clock=FakeClock(), timeout=LIVE) as store:
        calls: list[str] = []
        real = store.scripts.call

        def counted(name: str, numkeys: int, args: list[Any]) -> Any:
            calls.append(name)
            return real(name, numkeys, args)

        monkeypatch.setattr(store.scripts, "call", counted)
        limiter = Limiter("100/minute", algorithm="gcra", store=store, name=uuid.uuid4().hex)
        r = limiter.reserve("k", cost=40)
        assert calls == ["_reserve:bucket"]
        r.settle(10)
        assert calls == ["_reserve:bucket"] * 2
        limiter.reserve("k", cost=5).settle(5)  # no difference: no settle call
        assert calls == ["_reserve:bucket"] * 3
        assert limiter.peek("k").remaining == 85

"""The two-tier store on a real Redis: what passes here reaches Redis, near the limit
Redis decides, a known-full window denies here, and a store that fails loses nothing.

Two `RedisStore`s on one server stand for two processes. A fake clock drives the
time every script sees; syncs are run by hand (a sync interval of a minute keeps
the engines' own threads out of the way), so nothing sleeps to a boundary.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ratewarden import AsyncLimiter, Limiter, hit_many
from ratewarden._clock import FakeClock
from ratewarden.rules import RuleEngine, RuleFileError
from ratewarden.stores.redis import AsyncRedisStore, RedisStore, TwoTierSettings
from ratewarden.stores.redis._twotier import LocalLimit
from tests.redis_server import LIVE, RedisServer, redis_server

QUIET = TwoTierSettings(sync_interval=60.0)  # syncs happen when a test says so


class Counting:
    """Counts the script calls a store makes."""

    def __init__(self, store: RedisStore) -> None:
        self.calls = 0
        self.call = store.scripts.call
        store.scripts.call = self  # type: ignore[method-assign]
        assert store._local is None, "wrap the store before binding two-tier limits"

    def __call__(self, name: str, numkeys: int, args: list[Any]) -> Any:
        self.calls += 1
        return self.call(name, numkeys, args)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000.0)  # on a whole second: windows start here


@pytest.fixture
def stores(redis_single: RedisServer, clock: FakeClock) -> Iterator[list[RedisStore]]:
    made = [
        RedisStore(redis_single.url, clock=clock, two_tier=QUIET, timeout=LIVE) for _ in range(3)
    ]
    yield made
    for store in made:
        store.close()


def sync(*stores: RedisStore) -> None:
    for store in stores:
        assert store._local is not None
        store._local.sync()


def used(store: RedisStore, name: str, rate: str, key: str, algorithm: str) -> int:
    """The limit's count in Redis as an exact limiter sees it."""
    exact = Limiter(rate, store=store, name=name, algorithm=algorithm)
    decision = exact.peek(key)
    return decision.limit - decision.remaining


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_counter", "gcra"])
def test_every_hit_admitted_here_reaches_redis(
    stores: list[RedisStore], clock: FakeClock, algorithm: str
) -> None:
    a, b, observer = stores
    name = f"n{uuid.uuid4().hex}"
    limiters = [
        Limiter("100000/hour", store=s, name=name, algorithm=algorithm, two_tier=True)
        for s in (a, b)
    ]
    admitted = 0
    for round_ in range(30):
        for limiter in limiters:
            for _ in range(50 + round_):
                admitted += limiter.hit("k").allowed
        clock.advance(0.05)
        sync(a, b)
    assert admitted == sum(50 + r for r in range(30)) * 2  # far from the limit: all pass
    refilled = 1.5 * 100_000 / 3600 if algorithm == "gcra" else 0  # the bucket drains
    # Hits reach a bucket when they are synced, not when they passed: it counts the
    # drain from then on, at most a sync interval's worth (1.4 tokens) more.
    assert -1 < used(observer, name, "100000/hour", "k", algorithm) - (admitted - refilled) < 3


def test_two_processes_stop_at_the_limit(stores: list[RedisStore], clock: FakeClock) -> None:
    """Steady traffic well past the limit: the two together admit the limit, not
    more, and once the window is known full they deny without Redis."""
    a, b, observer = stores
    counters = [Counting(a), Counting(b)]
    name = f"n{uuid.uuid4().hex}"
    limiters = [
        Limiter("2000/hour", store=s, name=name, algorithm="fixed_window", two_tier=True)
        for s in (a, b)
    ]
    admitted = checks = 0
    for _ in range(200):
        for limiter, rate in zip(limiters, (120, 40), strict=True):  # 3:1 between them
            for _ in range(rate):
                admitted += limiter.hit("k").allowed
                checks += 1
        clock.advance(0.05)
        sync(a, b)
    assert used(observer, name, "2000/hour", "k", "fixed_window") == admitted
    assert 2000 * 0.99 <= admitted <= 2000 * 1.01, admitted
    calls = sum(c.calls for c in counters)
    assert calls / checks < 0.05, (calls, checks)
    before = sum(c.calls for c in counters)
    for limiter in limiters:
        for _ in range(1000):
            assert not limiter.hit("k").allowed
    assert sum(c.calls for c in counters) == before  # a full window denies here


def test_a_new_window_starts_empty(stores: list[RedisStore], clock: FakeClock) -> None:
    a, _, _ = stores
    limiter = Limiter("100/minute", store=a, name=f"n{uuid.uuid4().hex}",
                      algorithm="fixed_window", two_tier=True)  # fmt: skip
    assert sum(limiter.hit("k").allowed for _ in range(150)) == 100
    clock.advance(60)
    assert sum(limiter.hit("k").allowed for _ in range(150)) == 100


def test_hits_survive_a_store_that_fails(clock: FakeClock) -> None:
    with redis_server() as server:
        store = RedisStore(server.url, clock=clock, two_tier=QUIET, timeout=LIVE)
        name = f"n{uuid.uuid4().hex}"
        limiter = Limiter("100000/hour", store=store, name=name, algorithm="fixed_window",
                          two_tier=True, on_failure="fail_open")  # fmt: skip
        for _ in range(5):  # measured rates: most checks pass here
            for _ in range(100):
                limiter.hit("k")
            clock.advance(0.05)
            sync(store)
        admitted = 500
        server.kill()
        for _ in range(100):
            admitted += limiter.hit("k").allowed
        sync(store)  # fails: the hits stay
        fresh = limiter.hit("new-key", 2000)  # past what passes unknown: Redis must decide
        assert fresh.allowed
        assert fresh.degraded
        server.start()
        store.breaker.succeeded()
        sync(store)
        observer = RedisStore(server.url, clock=clock, timeout=LIVE)
        # the restarted server kept nothing: what it holds is what was sent again
        assert used(observer, name, "100000/hour", "k", "fixed_window") == admitted - 500
        store.close()
        observer.close()


def test_a_denied_request_costs_no_tier(stores: list[RedisStore], clock: FakeClock) -> None:
    a, _, observer = stores
    name = f"n{uuid.uuid4().hex}"
    small = Limiter("3/hour", store=a, name=name, algorithm="fixed_window", two_tier=True)
    exact = Limiter("100/hour", store=a, name=name + "x", algorithm="fixed_window")
    assert [hit_many([(small, "u"), (exact, "u")]).allowed for _ in range(5)] == [
        True, True, True, False, False,
    ]  # fmt: skip
    assert used(observer, name + "x", "100/hour", "u", "fixed_window") == 3
    # the exact tier denies: the two-tier one takes its count back
    tight = Limiter("1/hour", store=a, name=name + "y", algorithm="fixed_window")
    roomy = Limiter("100/hour", store=a, name=name + "z", algorithm="fixed_window", two_tier=True)
    assert hit_many([(roomy, "v"), (tight, "v")]).allowed
    assert not hit_many([(roomy, "v"), (tight, "v")]).allowed
    sync(a)
    assert used(observer, name + "z", "100/hour", "v", "fixed_window") == 1


def test_rule_files_turn_it_on(redis_single: RedisServer, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n"
        "  - {name: hot, rate: 1000/second, algorithm: fixed_window, store: two_tier}\n"
        "  - {name: cold, rate: 10/second}\n"
    )
    store = RedisStore(redis_single.url, timeout=LIVE)
    engine = RuleEngine(path, store)
    assert engine.check({}).allowed
    assert store._local is not None
    assert [(type(t), t.rule) for t in store._local.limits] == [(LocalLimit, "hot")]
    store.close()
    path.write_text("rules:\n  - {name: log, rate: 5/second, algorithm: sliding_window_log,"
                    " store: two_tier}\n")  # fmt: skip
    with pytest.raises(RuleFileError, match="store"):
        RuleEngine(path, RedisStore(redis_single.url, timeout=LIVE))


def test_unsupported_algorithms_are_refused(stores: list[RedisStore]) -> None:
    from ratewarden import ConfigurationError  # noqa: PLC0415

    with pytest.raises(ConfigurationError, match="two_tier"):
        Limiter("5/second", store=stores[0], algorithm="sliding_window_log", two_tier=True)


def test_async_counts_everything(redis_single: RedisServer, clock: FakeClock) -> None:
    async def main() -> tuple[int, int]:
        store = AsyncRedisStore(redis_single.url, clock=clock, two_tier=QUIET, timeout=LIVE)
        name = f"n{uuid.uuid4().hex}"
        limiter = AsyncLimiter("500/hour", store=store, name=name, algorithm="gcra",
                               two_tier=True)  # fmt: skip
        admitted = 0
        for _ in range(40):
            for _ in range(30):
                admitted += (await limiter.hit("k")).allowed
            clock.advance(0.05)
            assert store._local is not None
            await store._local.sync()
        await store.aclose()
        observer = RedisStore(redis_single.url, clock=clock, timeout=LIVE)
        seen = used(observer, name, "500/hour", "k", "gcra")
        observer.close()
        return admitted, seen

    admitted, seen = asyncio.run(main())
    assert 500 <= admitted <= 505, admitted  # the bucket's 500 plus what refilled
    assert abs(seen - (admitted - 2.0 * 500 / 3600)) < 1  # what the bucket drained since


def test_an_unknown_key_passes_a_little_then_asks(
    stores: list[RedisStore], clock: FakeClock
) -> None:
    """Before a process has a key's state it admits at most an eighth of the
    limit's last tenth on its own; the rest waits for Redis."""
    a, _, observer = stores
    counter = Counting(a)
    name = f"n{uuid.uuid4().hex}"
    full = Limiter("1000/hour", store=observer, name=name, algorithm="fixed_window")
    for _ in range(1000):
        full.hit("k")  # another process has used the whole window
    limiter = Limiter("1000/hour", store=a, name=name, algorithm="fixed_window", two_tier=True)
    admitted = sum(limiter.hit("k").allowed for _ in range(50))
    assert admitted == 12  # 1000 x 0.1 / 8, on no knowledge
    assert counter.calls == 1  # the 13th asked Redis, and learnt the window is full
    sync(a)
    assert used(observer, name, "1000/hour", "k", "fixed_window") == 1012


def test_memory_stays_bounded_under_a_flood_of_keys(
    redis_single: RedisServer, clock: FakeClock
) -> None:
    store = RedisStore(redis_single.url, clock=clock, timeout=LIVE,
                       two_tier=TwoTierSettings(sync_interval=60, max_keys=100))  # fmt: skip
    limiter = Limiter("1000/hour", store=store, name=f"n{uuid.uuid4().hex}",
                      algorithm="fixed_window", two_tier=True)  # fmt: skip
    for i in range(300):  # each passes on no knowledge: its hit waits for a sync
        assert limiter.hit(f"k{i}").allowed
    assert store._local is not None
    entries = store._local.limits[0].entries
    assert len(entries) == 111  # a tenth over, then keys go to Redis, not to memory
    sync(store)
    assert len(entries) == 90  # the sync sent every hit, then dropped the oldest
    observer = RedisStore(redis_single.url, clock=clock, timeout=LIVE)
    assert sum(used(observer, limiter.name or "", "1000/hour", f"k{i}", "fixed_window")
               for i in range(300)) == 300  # fmt: skip
    store.close()
    observer.close()


def test_a_store_dropped_without_close_ends_its_thread(redis_single: RedisServer) -> None:
    import gc  # noqa: PLC0415
    import threading  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    store = RedisStore(redis_single.url, two_tier=TwoTierSettings(sync_interval=0.01), timeout=LIVE)
    Limiter("10/second", store=store, two_tier=True).hit("k")
    assert store._local is not None
    thread = store._local.thread
    assert thread is not None
    # dropped without close, its connection is closed by the collector, which
    # warns of it: the warning is what dropping a store costs, not what is tested
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del store
        gc.collect()
        thread.join(timeout=2)
        gc.collect()
    assert not thread.is_alive()
    assert all(t.name != "ratewarden-two-tier" or t is not thread for t in threading.enumerate())


def test_a_sync_call_that_fails_unforeseen_keeps_its_hits(
    redis_single: RedisServer, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A sync call that raises what no store raises (a bug) gives its hits back to
    be sent again, and says so: the twins alike, the sync one calling one chunk
    after another, the async one gathering them."""

    def broken(*args: Any) -> Any:
        raise RuntimeError("unforeseen")

    async def abroken(*args: Any) -> Any:
        raise RuntimeError("unforeseen")

    sync_name, async_name = f"n{uuid.uuid4().hex}", f"n{uuid.uuid4().hex}"
    store = RedisStore(redis_single.url, clock=clock, two_tier=QUIET, timeout=LIVE)
    limiter = Limiter("100000/hour", store=store, name=sync_name, algorithm="fixed_window",
                      two_tier=True)  # fmt: skip
    sync_admitted = sum(limiter.hit("k").allowed for _ in range(100))
    engine = store._local
    assert engine is not None
    real, engine.call = engine.call, broken
    engine.sync()
    engine.call = real
    engine.sync()
    store.close()

    async def main() -> int:
        store = AsyncRedisStore(redis_single.url, clock=clock, two_tier=QUIET, timeout=LIVE)
        limiter = AsyncLimiter("100000/hour", store=store, name=async_name,
                               algorithm="fixed_window", two_tier=True)  # fmt: skip
        admitted = sum([(await limiter.hit("k")).allowed for _ in range(100)])
        engine = store._local
        assert engine is not None
        real, engine.call = engine.call, abroken
        await engine.sync()
        engine.call = real
        await engine.sync()
        await store.aclose()
        return admitted

    async_admitted = asyncio.run(main())
    observer = RedisStore(redis_single.url, clock=clock, timeout=LIVE)
    assert used(observer, sync_name, "100000/hour", "k", "fixed_window") == sync_admitted == 100
    assert used(observer, async_name, "100000/hour", "k", "fixed_window") == async_admitted == 100
    observer.close()
    failures = [r for r in caplog.records if r.getMessage() == "two-tier sync call failed"]
    assert len(failures) == 2

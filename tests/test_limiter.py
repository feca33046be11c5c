from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
import time

import pytest

import ratewarden
from ratewarden import (
    AsyncLimiter,
    AsyncMemoryStore,
    ConfigurationError,
    Decision,
    FakeClock,
    Limiter,
    MemoryStore,
    RateLimitTimeout,
)


def test_the_public_names_are_a_contract() -> None:
    for name in ("Limiter", "AsyncLimiter", "MemoryStore", "Decision", "RateLimitTimeout",
                 "ConfigurationError"):  # fmt: skip
        assert name in ratewarden.__all__
    assert set(ratewarden.ALGORITHMS) == {
        "fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket",
        "leaky_bucket", "gcra",
    }  # fmt: skip


def test_import_is_light() -> None:
    code = "import sys, ratewarden; print(sorted(m for m in sys.modules if m.split('.')[0] in "
    code += "{'redis','starlette','uvicorn','grpc','prometheus_client','httpx','flask'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_defaults_and_repr() -> None:
    limiter = Limiter("100/minute")
    assert limiter.algorithm == "sliding_window_counter"
    assert isinstance(limiter.store, MemoryStore)
    assert repr(limiter).startswith("Limiter('100/minute', algorithm='sliding_window_counter'")
    bucket = Limiter("10/second", algorithm="token_bucket", burst=20, name="api")
    assert repr(bucket).startswith("Limiter('10/second', algorithm='token_bucket', burst=20,")
    decision = bucket.hit("k")
    assert decision == Decision(True, 20, 19, 0.1, 0.0, "api")
    assert bool(decision)
    assert decision.reason is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithm": "leaky"}, "unknown algorithm 'leaky'"),
        ({"algorithm": "fixed_window", "burst": 5}, "burst applies to"),
        ({"algorithm": "token_bucket", "burst": 0}, "burst must be"),
        ({"algorithm": "gcra", "refill": "interval"}, "token_bucket mode"),
        ({"algorithm": "token_bucket", "refill": "sometimes"}, "refill must be"),
        ({"name": 5}, "name must be"),
    ],
)
def test_bad_options_are_clear(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Limiter("10/second", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=message):
        AsyncLimiter("10/second", **kwargs)  # type: ignore[arg-type]


def bucket_on(clock: FakeClock, rate: str = "2/second") -> Limiter:
    return Limiter(rate, algorithm="token_bucket", store=MemoryStore(clock=clock))


def test_acquire_waits_exactly_as_long_as_needed() -> None:
    clock = FakeClock()
    limiter = bucket_on(clock)
    start = clock.now_ns
    for _ in range(2):
        assert limiter.acquire("k", max_wait=0).allowed
    decision = limiter.acquire("k", max_wait=1.0)
    assert decision.allowed
    assert clock.now_ns - start == 500_000_000  # one token at 2/s, not a tick more


def test_acquire_with_zero_wait_tries_once() -> None:
    clock = FakeClock()
    limiter = bucket_on(clock)
    limiter.hit("k", 2)
    with pytest.raises(RateLimitTimeout, match="max_wait=0") as info:
        limiter.acquire("k", max_wait=0)
    assert info.value.retry_after == 0.5
    assert info.value.key == "k"
    assert clock.now_ns == 1_700_000_000 * 10**9  # it did not wait


def test_acquire_gives_up_at_once_when_the_deadline_cannot_be_met() -> None:
    clock = FakeClock()
    limiter = bucket_on(clock, "1/minute")
    limiter.hit("k")
    with pytest.raises(RateLimitTimeout, match="next in 60s"):
        limiter.acquire("k", max_wait=59.0)
    assert clock.now_ns == 1_700_000_000 * 10**9
    assert limiter.acquire("k", max_wait=60.0).allowed


def test_acquire_of_an_impossible_cost_fails_fast() -> None:
    limiter = bucket_on(FakeClock())
    with pytest.raises(RateLimitTimeout, match="can ever grant") as info:
        limiter.acquire("k", max_wait=math.inf, cost=3)
    assert info.value.retry_after == math.inf


@pytest.mark.parametrize("max_wait", [-1, math.nan, "1", None, True])
def test_bad_max_wait(max_wait: object) -> None:
    with pytest.raises(ConfigurationError, match="max_wait"):
        bucket_on(FakeClock()).acquire("k", max_wait=max_wait)  # type: ignore[arg-type]


def test_waiting_threads_are_served_in_arrival_order() -> None:
    """Real time, small waits: 5 threads queue on a key refilled every 20 ms."""
    limiter = Limiter("50/second", algorithm="token_bucket", burst=1)
    limiter.hit("k")
    order: list[int] = []

    def queue_up(i: int) -> None:
        limiter.acquire("k", max_wait=5.0)
        order.append(i)

    threads = []
    for i in range(5):
        thread = threading.Thread(target=queue_up, args=(i,))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 2
        while len(limiter._turns._queues.get("k", ())) < i + 1 and time.monotonic() < deadline:
            time.sleep(0.001)  # wait until this thread has queued (not a time boundary)
    for thread in threads:
        thread.join()
    assert order == [0, 1, 2, 3, 4]
    assert len(limiter._turns) == 0  # no queue left behind


def test_a_queued_caller_times_out_and_leaves_the_queue() -> None:
    limiter = Limiter("1/minute", algorithm="token_bucket")
    limiter.hit("k")
    done = threading.Event()

    def head() -> None:
        with pytest.raises(RateLimitTimeout):
            limiter.acquire("k", max_wait=0.3)  # gives up at once: 60 s > 0.3 s
        done.set()

    # hold the turn ourselves so the second caller must queue
    assert limiter._turns.wait_turn("k", 0)
    with pytest.raises(RateLimitTimeout, match="no turn within"):
        limiter.acquire("k", max_wait=0.05)
    limiter._turns.leave("k")
    head()
    assert done.is_set()
    assert len(limiter._turns) == 0


def test_async_limiter_mirrors_the_sync_one() -> None:
    async def main() -> None:
        clock = FakeClock()
        limiter = AsyncLimiter("10/second", algorithm="token_bucket", burst=20,
                               store=AsyncMemoryStore(clock=clock))  # fmt: skip
        assert (await limiter.hit("k", 20)).remaining == 0
        assert not (await limiter.peek("k")).allowed
        start = clock.now_ns
        await limiter.acquire("k", max_wait=2.0)
        assert clock.now_ns - start == 100_000_000
        with pytest.raises(RateLimitTimeout):
            await limiter.acquire("k", max_wait=0)
        await limiter.reset("k")
        assert (await limiter.hit("k")).remaining == 19
        assert repr(limiter).startswith("AsyncLimiter('10/second', algorithm='token_bucket'")

    asyncio.run(main())


def test_async_acquire_does_not_block_the_loop_and_serves_in_order() -> None:
    async def main() -> tuple[list[int], int]:
        limiter = AsyncLimiter("40/second", algorithm="gcra", burst=1)
        await limiter.hit("k")
        order: list[int] = []
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        async def worker(i: int) -> None:
            await limiter.acquire("k", max_wait=5.0)
            order.append(i)

        tick_task = asyncio.create_task(ticker())
        await asyncio.gather(*(worker(i) for i in range(4)))
        tick_task.cancel()
        return order, ticks

    order, ticks = asyncio.run(main())
    assert order == [0, 1, 2, 3]
    assert ticks >= 5  # the loop kept running during ~100 ms of waiting


def test_a_cancelled_async_waiter_does_not_strand_the_queue() -> None:
    async def main() -> None:
        clock = FakeClock()
        limiter = AsyncLimiter("1/second", algorithm="token_bucket",
                               store=AsyncMemoryStore(clock=clock))  # fmt: skip
        assert await limiter._turns.wait_turn("k", 0)  # hold the turn
        waiter = asyncio.create_task(limiter.acquire("k", max_wait=10.0))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        limiter._turns.leave("k")
        assert len(limiter._turns) == 0
        assert (await limiter.acquire("k", max_wait=0)).allowed

    asyncio.run(main())


def test_acquire_forever_under_contention() -> None:
    """max_wait=inf with other callers queued: Event.wait(inf) overflows, and a
    waiter that fails must not strand the key for every later caller."""
    limiter = Limiter("200/second", algorithm="gcra", burst=1)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(3):
                limiter.acquire("k", math.inf)
        except BaseException as exc:  # pragma: no cover - the failure being tested
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert limiter.acquire("k", 1.0).allowed  # the key is not stranded


def test_a_name_with_its_own_rate_after_an_at_counts_under_the_plain_name() -> None:
    # the rule engine names one rate of a rule with several "rule@rate": its counter
    # stays the rule's, so adding a rate to a rule does not reset the one it had
    def prefix(name: str | None, rate: str = "5/minute") -> str:
        return Limiter(rate, name=name).key_prefix

    assert prefix("api@5/minute") == prefix("api") == "api:sliding_window_counter/5/minute:"
    assert prefix("api@6/minute") == "api@6/minute:sliding_window_counter/5/minute:"
    assert prefix("@5/minute") == "@5/minute:sliding_window_counter/5/minute:"
    assert Limiter("5/minute", name="api@5/minute").name == "api@5/minute"  # shown as given


def test_acquire_with_no_wait_tries_once_on_the_real_clock() -> None:
    # the system clock moves between the deadline and the check: max_wait=0 is "now"
    limiter = Limiter("1/minute", algorithm="token_bucket")
    assert limiter.acquire("k", max_wait=0).allowed
    with pytest.raises(RateLimitTimeout):
        limiter.acquire("k", max_wait=0)

    async def main() -> None:
        alimiter = AsyncLimiter("1/minute", algorithm="token_bucket")
        assert (await alimiter.acquire("k", max_wait=0)).allowed
        with pytest.raises(RateLimitTimeout):
            await alimiter.acquire("k", max_wait=0)

    asyncio.run(main())


@pytest.mark.parametrize("turns_between", range(5))
def test_a_waiter_cancelled_as_its_turn_comes_is_cancelled_and_passes_the_turn_on(
    turns_between: int,
) -> None:
    """A waiter cancelled while its turn comes (the one before it leaves, and
    the cancel lands a few loop turns later, before the waiter ran again) ends
    cancelled, not as if it had its turn, and the turn goes to the next in line,
    whichever loop turn the cancel lands on. (On Python 3.11, asyncio.wait_for
    can lose a cancel that lands as its wait completes: see the two-tier store's
    test_async_sync_task_ends_when_cancelled_as_it_wakes.)"""
    from ratewarden.kernel import AsyncTurns  # noqa: PLC0415

    async def main() -> None:
        turns = AsyncTurns(FakeClock())
        assert await turns.wait_turn("k", math.inf)  # the head
        second = asyncio.create_task(turns.wait_turn("k", math.inf))
        third = asyncio.create_task(turns.wait_turn("k", math.inf))
        await asyncio.sleep(0.01)  # both wait in line
        turns.leave("k")  # the second's turn comes
        for _ in range(turns_between):
            await asyncio.sleep(0)
        asked = second.cancel()  # False: it ran, had its turn, and ended
        await asyncio.sleep(0.01)
        if asked:
            assert second.cancelled(), "the cancel was lost: the waiter went on"
            assert third.done(), "the cancelled waiter kept the turn"
            assert third.result()
        else:
            assert second.result()
            turns.leave("k")
            await asyncio.sleep(0.01)
            assert third.result()

    asyncio.run(main())

"""`PacedQueue` and `AsyncPacedQueue`: slots evenly spaced, a full line turned
away at once, a slot past max_wait never taken."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from ratewarden import (
    AsyncMemoryStore,
    AsyncPacedQueue,
    ConfigurationError,
    FakeClock,
    MemoryStore,
    PacedQueue,
    QueueFull,
    RateLimitTimeout,
)


def queue_on(clock: FakeClock, size: int = 3) -> PacedQueue:
    return PacedQueue("100/second", size=size, store=MemoryStore(clock=clock), name="q")


def test_slots_are_evenly_spaced_and_a_full_line_is_turned_away_at_once() -> None:
    clock = FakeClock()
    queue = queue_on(clock)
    assert [queue.enter("k") for _ in range(4)] == [0.0, 0.01, 0.02, 0.03]
    with pytest.raises(QueueFull) as info:
        queue.enter("k")
    assert info.value.retry_after == 0.01  # the time until the line has room
    assert "line of 3 is full" in str(info.value)
    assert queue.enter("other") == 0.0  # a line per key
    clock.advance(0.015)
    assert queue.enter("k") == 0.025  # after the one due at 0.03
    with pytest.raises(QueueFull):
        queue.enter("k")


def test_a_slot_past_max_wait_is_refused_and_not_taken() -> None:
    clock = FakeClock()
    queue = queue_on(clock, size=10)
    assert [queue.enter("k", max_wait=0.025) for _ in range(3)] == [0.0, 0.01, 0.02]
    with pytest.raises(RateLimitTimeout, match="past max_wait") as info:
        queue.enter("k", max_wait=0.025)
    assert not isinstance(info.value, QueueFull)
    assert info.value.retry_after == 0.03
    assert queue.enter("k", max_wait=0.03) == 0.03  # the refused caller took nothing
    with pytest.raises(RateLimitTimeout):
        queue.enter("k", max_wait=0)


def test_max_wait_zero_takes_only_a_slot_due_now() -> None:
    clock = FakeClock()
    queue = queue_on(clock)
    assert queue.enter("k", max_wait=0) == 0.0
    with pytest.raises(RateLimitTimeout):
        queue.enter("k", max_wait=0)
    clock.advance(0.01)
    assert queue.enter("k", max_wait=0) == 0.0


def test_cost_takes_that_many_slots() -> None:
    queue = queue_on(FakeClock(), size=5)
    assert queue.enter("k", cost=3) == 0.0
    assert queue.enter("k") == 0.03
    with pytest.raises(QueueFull, match="can never enter"):
        queue.enter("k", cost=7)


def test_wait_sleeps_until_the_slot_on_the_store_clock() -> None:
    clock = FakeClock()
    queue = queue_on(clock)
    start = clock.time_ns()
    released = []
    for _ in range(4):
        queue.wait("k")
        released.append(clock.time_ns() - start)
    assert released == [0, 10_000_000, 20_000_000, 30_000_000]


def test_threads_share_one_schedule() -> None:
    clock = FakeClock()
    queue = PacedQueue("1000/second", size=1000, store=MemoryStore(clock=clock))
    waits: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(100):
            wait = queue.enter("k", max_wait=0.5)
            with lock:
                waits.append(wait)

    threads = [threading.Thread(target=worker) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(round(w * 1000) for w in waits) == list(range(500))  # no slot twice


def test_async_twin_spaces_concurrent_callers() -> None:
    clock = FakeClock()
    queue = AsyncPacedQueue("100/second", size=50, store=AsyncMemoryStore(clock=clock))

    async def scenario() -> list[float]:
        return list(await asyncio.gather(*(queue.enter("k", max_wait=1.0) for _ in range(20))))

    waits = asyncio.run(scenario())
    assert sorted(waits) == [k / 100 for k in range(20)]

    async def full() -> None:
        await queue.enter("k", max_wait=0.05)

    with pytest.raises(RateLimitTimeout):
        asyncio.run(full())


def test_async_wait_sleeps_without_blocking() -> None:
    clock = FakeClock()
    queue = AsyncPacedQueue("10/second", size=5, store=AsyncMemoryStore(clock=clock))

    async def scenario() -> list[int]:
        start = clock.time_ns()
        out = []
        for _ in range(3):
            await queue.wait("k")
            out.append(clock.time_ns() - start)
        return out

    assert asyncio.run(scenario()) == [0, 100_000_000, 200_000_000]


@pytest.mark.parametrize("size", [-1, 1.5, True, 10_000_001])
def test_bad_size(size: object) -> None:
    with pytest.raises(ConfigurationError, match="size is"):
        PacedQueue("1/second", size=size)  # type: ignore[arg-type]


def test_repr_shows_the_line() -> None:
    queue = PacedQueue("5/second", size=10, name="exports")
    assert repr(queue).startswith("PacedQueue('5/second', size=10, name='exports', store=")
    assert queue.interval == 0.2
    assert not math.isinf(queue.rate.period)


@pytest.mark.parametrize("spin", [-0.1, 0.5, True, "1"])
def test_bad_spin(spin: object) -> None:
    with pytest.raises(ConfigurationError, match="spin is"):
        AsyncPacedQueue("1/second", size=1, spin=spin)  # type: ignore[arg-type]


def test_spinning_wait_is_never_early_on_the_system_clock() -> None:
    queue = AsyncPacedQueue("200/second", size=10)  # a real clock: a short, real wait

    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        out = []
        for _ in range(3):
            before = loop.time()
            waited = await queue.wait("k")
            out.append(loop.time() - before - waited)
        return out

    assert all(late >= 0 for late in asyncio.run(scenario()))

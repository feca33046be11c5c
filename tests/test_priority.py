"""Priority classes of waiting callers: a higher class is served before lower
ones that arrived earlier; every caller keeps its own deadline."""

from __future__ import annotations

import asyncio
import threading

import pytest

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


def alimiter(clock: FakeClock) -> AsyncLimiter:
    return AsyncLimiter("1/second", algorithm="gcra", store=AsyncMemoryStore(clock=clock),
                        classes=["paid", "free"])  # fmt: skip


def test_a_higher_class_overtakes_lower_ones_that_arrived_earlier() -> None:
    clock = FakeClock()
    limiter = alimiter(clock)
    start = clock.time_ns()
    served: list[tuple[str, float]] = []

    async def caller(name: str, priority: str) -> None:  # they arrive in this order
        await limiter.acquire("k", max_wait=10, priority=priority)
        served.append((name, (clock.time_ns() - start) / 1e9))

    async def scenario() -> None:
        await limiter.acquire("k", max_wait=0)  # the permit of t=0 is spent
        await asyncio.gather(caller("free-1", "free"), caller("free-2", "free"),
                             caller("paid-1", "paid"), caller("paid-2", "paid"))  # fmt: skip

    asyncio.run(scenario())
    # free-1 held the turn, sleeping towards t=1; the paid ones arrived meanwhile
    # and take the permits of t=1 and t=2; the free ones follow in arrival order
    assert served == [("paid-1", 1.0), ("paid-2", 2.0), ("free-1", 3.0), ("free-2", 4.0)]


def test_equal_classes_keep_arrival_order_and_ints_are_classes_too() -> None:
    clock = FakeClock()
    limiter = AsyncLimiter("1/second", algorithm="gcra", store=AsyncMemoryStore(clock=clock))
    served: list[str] = []

    async def caller(name: str, priority: int) -> None:
        await limiter.acquire("k", max_wait=10, priority=priority)
        served.append(name)

    async def scenario() -> None:
        await limiter.acquire("k", max_wait=0)
        await asyncio.gather(caller("a", 0), caller("b", 5), caller("c", 5), caller("d", 0),
                             caller("e", 9))  # fmt: skip

    asyncio.run(scenario())
    assert served == ["e", "b", "c", "a", "d"]


def test_a_lower_class_is_told_at_its_deadline_while_higher_ones_stream_in() -> None:
    clock = FakeClock()
    limiter = alimiter(clock)
    start = clock.time_ns()
    granted: list[tuple[float, bool]] = []  # each permit: when, and whether free still waits
    told: list[bool] = []
    hit = limiter.hit

    def free_in_line() -> bool:  # the free caller's entry: rank 0 (paid is -1)
        return any(entry[0] == 0 for entry in limiter._turns._queues.get("k", []))

    async def watched_hit(key: str, cost: int = 1) -> Decision:
        decision = await hit(key, cost)
        if decision.allowed:
            granted.append(((clock.time_ns() - start) / 1e9, free_in_line()))
        return decision

    limiter.hit = watched_hit

    async def low() -> None:
        try:
            await limiter.acquire("k", max_wait=2.5, priority="free")
        except RateLimitTimeout:
            told.append(True)

    async def highs() -> None:
        for _ in range(3):  # a paid caller always waiting: the free one never gets in
            await limiter.acquire("k", max_wait=10, priority="paid")

    async def scenario() -> None:
        await limiter.acquire("k", max_wait=0)
        await asyncio.gather(highs(), low(), highs())

    asyncio.run(scenario())
    assert told == [True]
    # told as the head went to sleep towards the permit of t=3, which comes after
    # its 2.5 s: out of the line before that permit, never kept waiting for it
    assert granted[1:4] == [(1.0, True), (2.0, True), (3.0, False)]


def test_threads_of_a_higher_class_go_first() -> None:
    clock = FakeClock()
    limiter = Limiter("1/second", algorithm="gcra", store=MemoryStore(clock=clock),
                      classes=["paid", "free"])  # fmt: skip
    limiter.acquire("k", max_wait=0)
    served: list[str] = []
    lock = threading.Lock()
    head_sleeping = threading.Event()
    release = threading.Event()
    sleep = clock.sleep

    def slow_sleep(seconds: float) -> None:  # hold the head in its sleep until told
        head_sleeping.set()
        release.wait(5)
        sleep(seconds)

    clock.sleep = slow_sleep  # type: ignore[method-assign]

    def caller(name: str, priority: str) -> None:
        limiter.acquire("k", max_wait=10, priority=priority)
        with lock:
            served.append(name)

    free = threading.Thread(target=caller, args=("free", "free"))
    free.start()
    assert head_sleeping.wait(5)
    paid = threading.Thread(target=caller, args=("paid", "paid"))
    paid.start()
    while len(limiter._turns._queues["k"]) < 2:  # the paid caller stands in line
        threading.Event().wait(0.001)
    release.set()
    free.join(5)
    paid.join(5)
    assert served == ["paid", "free"]


@pytest.mark.parametrize(
    ("classes", "priority", "message"),
    [
        ((), "paid", "unknown priority class 'paid'"),
        (("paid", "free"), "gold", "classes: paid, free"),
        (("paid",), 1.5, "priority is an int or a class name"),
    ],
)
def test_bad_priorities_are_named(classes: tuple[str, ...], priority: object, message: str) -> None:
    limiter = Limiter("1/second", classes=classes)
    with pytest.raises(ConfigurationError, match=message):
        limiter.acquire("k", max_wait=0, priority=priority)  # type: ignore[arg-type]


@pytest.mark.parametrize("classes", ["paid", ["a", "a"], ["a", ""], [1]])
def test_bad_classes(classes: object) -> None:
    with pytest.raises(ConfigurationError, match="classes is a list"):
        Limiter("1/second", classes=classes)  # type: ignore[arg-type]


def test_a_turn_that_comes_after_the_deadline_is_refused() -> None:
    clock = FakeClock()
    limiter = AsyncLimiter("1/second", algorithm="gcra", store=AsyncMemoryStore(clock=clock))

    async def scenario() -> None:
        await limiter.acquire("k", max_wait=0)

        async def late_head() -> None:  # the head that frees the turn wakes late
            await limiter.acquire("k", max_wait=5)
            clock.advance(3.0)

        async def follower() -> None:
            await limiter.acquire("k", max_wait=2.0)

        results = await asyncio.gather(late_head(), follower(), return_exceptions=True)
        assert results[0] is None
        assert isinstance(results[1], RateLimitTimeout)

    asyncio.run(scenario())


def test_spin_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="spin is"):
        AsyncLimiter("1/second", spin=-1)


def test_a_caller_cancelled_while_stepping_aside_leaves_the_turn_to_its_holder() -> None:
    clock = FakeClock()
    wake = asyncio.Event()
    asleep = clock.asleep

    async def held_sleep(seconds: float) -> None:  # the head sleeps until told
        await wake.wait()
        await asleep(seconds)

    clock.asleep = held_sleep  # type: ignore[method-assign]
    limiter = alimiter(clock)

    async def scenario() -> tuple[Decision | BaseException, ...]:
        await limiter.acquire("k", max_wait=0)
        free = asyncio.create_task(limiter.acquire("k", max_wait=10, priority="free"))
        await asyncio.sleep(0)  # free holds the turn, asleep towards its permit
        paid = asyncio.create_task(limiter.acquire("k", max_wait=10, priority="paid"))
        await asyncio.sleep(0)  # paid stands in line behind it
        wake.set()
        while not free_waits_behind_paid():  # free has stepped aside for paid
            await asyncio.sleep(0)
        free.cancel()
        later = asyncio.create_task(limiter.acquire("k", max_wait=10, priority="free"))
        return await asyncio.gather(free, paid, later, return_exceptions=True)

    def free_waits_behind_paid() -> bool:
        line = limiter._turns._queues.get("k", [])
        return [entry[0] for entry in line] == [-1, 0]

    free, paid, later = asyncio.run(scenario())
    assert isinstance(free, asyncio.CancelledError)
    # the turn stays paid's until it leaves it: nobody else's line is torn down
    assert isinstance(paid, Decision)
    assert isinstance(later, Decision)
    assert len(limiter._turns) == 0

"""Waiters for a concurrency slot are served in line: by priority, then by
arrival, across every caller that shares the store; a waiter that dies or gives
up stops holding up the line."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from ratewarden import (
    AsyncConcurrencyLimiter,
    AsyncMemoryStore,
    ConcurrencyLimiter,
    ConfigurationError,
    MemoryStore,
    RateLimitTimeout,
)
from ratewarden.stores.leases import BUSY, OK, LeaseTable, Outcome, Place
from ratewarden.stores.redis import RedisStore
from tests.redis_server import RedisServer

T0 = 1_763_700_000_000_000
LEASE, TICKET = 60_000_000, 500_000


def take(table: LeaseTable, lease_id: str, at: int, *, limit: int = 1, priority: int = 0,
         queued_at: int = 0, waits: bool = True) -> Outcome:  # fmt: skip
    place = Place(priority, queued_at, TICKET if waits else 0)
    return table.call("take", "k", lease_id, limit, LEASE, place=place, now=at)


def test_a_freed_slot_goes_to_the_first_in_line_not_to_who_asks_next() -> None:
    table = LeaseTable()
    assert take(table, "a", T0).status == OK
    b = take(table, "b", T0 + 1)
    c = take(table, "c", T0 + 2)
    assert (b.status, b.queued_at, c.queued_at) == (BUSY, T0 + 1, T0 + 2)
    table.call("release", "k", "a", 1, 0, now=T0 + 10)
    assert take(table, "c", T0 + 11, queued_at=c.queued_at).status == BUSY  # b is first
    assert take(table, "d", T0 + 12, waits=False).status == BUSY  # so is a caller who won't wait
    assert take(table, "b", T0 + 13, queued_at=b.queued_at).status == OK
    table.call("release", "k", "b", 1, 0, now=T0 + 20)
    assert take(table, "c", T0 + 21, queued_at=c.queued_at).status == OK


def test_with_room_for_two_the_second_in_line_goes_too() -> None:
    table = LeaseTable()
    for lease in "ab":
        take(table, lease, T0, limit=2)
    c = take(table, "c", T0 + 1, limit=2)
    d = take(table, "d", T0 + 2, limit=2)
    for lease in "ab":
        table.call("release", "k", lease, 2, 0, now=T0 + 10)
    assert take(table, "d", T0 + 11, limit=2, queued_at=d.queued_at).status == OK
    assert take(table, "e", T0 + 12, limit=2, waits=False).status == BUSY  # c's
    assert take(table, "c", T0 + 13, limit=2, queued_at=c.queued_at).status == OK


def test_a_higher_priority_goes_first_whenever_it_came() -> None:
    table = LeaseTable()
    take(table, "a", T0)
    low = take(table, "low", T0 + 1, priority=-1)
    high = take(table, "high", T0 + 2, priority=5)
    table.call("release", "k", "a", 1, 0, now=T0 + 10)
    assert take(table, "low", T0 + 11, priority=-1, queued_at=low.queued_at).status == BUSY
    assert take(table, "high", T0 + 12, priority=5, queued_at=high.queued_at).status == OK


def test_a_waiter_that_stops_asking_holds_the_line_one_ticket_long() -> None:
    table = LeaseTable()
    take(table, "a", T0)
    take(table, "dead", T0 + 1)  # never asks again
    c = take(table, "c", T0 + 2)
    table.call("release", "k", "a", 1, 0, now=T0 + 10)
    assert take(table, "c", T0 + TICKET, queued_at=c.queued_at).status == BUSY
    assert take(table, "c", T0 + 1 + TICKET, queued_at=c.queued_at).status == OK
    assert not table.tickets  # the dead one's ticket went; c's with its grant


def test_a_waiter_that_leaves_lets_the_next_go_at_once() -> None:
    table = LeaseTable()
    take(table, "a", T0)
    b = take(table, "b", T0 + 1)
    c = take(table, "c", T0 + 2)
    table.call("release", "k", "a", 1, 0, now=T0 + 10)
    left = table.call("leave", "k", "b", 1, 0, place=Place(0, b.queued_at), now=T0 + 11)
    assert left.status == OK
    assert take(table, "c", T0 + 12, queued_at=c.queued_at).status == OK
    assert table.call("leave", "k", "b", 1, 0, place=Place(0, b.queued_at), now=T0 + 13).status == 0


def test_a_waiter_whose_ticket_ended_keeps_its_place_when_it_asks_again() -> None:
    table = LeaseTable()
    take(table, "a", T0)
    b = take(table, "b", T0 + 1)
    c = take(table, "c", T0 + 2)
    take(table, "c", T0 + TICKET, queued_at=c.queued_at)  # c asks again; b's has ended
    table.call("release", "k", "a", 1, 0, now=T0 + TICKET + 1)
    again = take(table, "b", T0 + TICKET + 2, queued_at=b.queued_at)
    assert again.status == OK  # back in at its first place, before c


def served_in_order(limiter: AsyncConcurrencyLimiter, asks: list[int]) -> list[int]:
    """Waiters ask in the order of ``asks`` (their priorities) while the slot is
    held; the order in which they got it."""

    async def main() -> list[int]:
        order: list[int] = []
        first = await limiter.hold("k").__aenter__()

        async def waiter(i: int, priority: int) -> None:
            async with limiter.hold("k", max_wait=10.0, priority=priority):
                order.append(i)
                await asyncio.sleep(0.002)

        tasks = []
        for i, priority in enumerate(asks):
            tasks.append(asyncio.create_task(waiter(i, priority)))
            await asyncio.sleep(0.003)  # each in line before the next comes
        await first.release()
        await asyncio.gather(*tasks)
        return order

    return asyncio.run(main())


def test_async_waiters_are_served_first_come_first_served() -> None:
    limiter = AsyncConcurrencyLimiter(1, store=AsyncMemoryStore())
    assert served_in_order(limiter, [0] * 12) == list(range(12))


def test_async_waiters_are_served_by_priority_then_arrival() -> None:
    limiter = AsyncConcurrencyLimiter(1, store=AsyncMemoryStore())
    asks = [0, 2, 0, 1, 2, -1, 1, 0]
    order = served_in_order(limiter, asks)
    assert order == sorted(range(len(asks)), key=lambda i: (-asks[i], i))


@pytest.fixture
def redis_store(redis_single: RedisServer) -> Iterator[RedisStore]:
    store = RedisStore(redis_single.url, timeout=5.0)
    yield store
    store.close()


@pytest.mark.parametrize("where", ["memory", "redis"])
def test_threads_are_served_in_line(where: str, request: pytest.FixtureRequest) -> None:
    store = MemoryStore() if where == "memory" else request.getfixturevalue("redis_store")
    limiter = ConcurrencyLimiter(1, store=store, name=f"line-{time.time_ns()}")
    order: list[int] = []
    first = limiter.hold("k").__enter__()

    def waiter(i: int) -> None:
        with limiter.hold("k", max_wait=10.0):
            order.append(i)
            time.sleep(0.002)

    threads = []
    for i in range(8):
        threads.append(threading.Thread(target=waiter, args=(i,)))
        threads[-1].start()
        deadline = time.monotonic() + 5
        while limiter.stats.waiting <= i and time.monotonic() < deadline:
            time.sleep(0.001)  # in line before the next comes
    first.release()
    for thread in threads:
        thread.join(20)
    assert order == list(range(8))


def test_a_waiter_that_times_out_leaves_the_line() -> None:
    store = MemoryStore()
    limiter = ConcurrencyLimiter(1, store=store)
    with limiter.hold("k"):
        with pytest.raises(RateLimitTimeout):
            limiter.hold("k", max_wait=0.01).__enter__()
        assert not store.leases().table.tickets
        # nobody in line: a caller who does not wait gets the slot once it is free
    with limiter.hold("k"):
        pass


def test_a_cancelled_waiter_leaves_the_line() -> None:
    async def main() -> int:
        store = AsyncMemoryStore()
        limiter = AsyncConcurrencyLimiter(1, store=store)
        async with limiter.hold("k"):
            task = asyncio.create_task(limiter.hold("k", max_wait=10.0).__aenter__())
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.01)  # the release in the background
            return len(store.sync.leases().table.tickets)

    assert asyncio.run(main()) == 0


@pytest.mark.parametrize("priority", [True, 1.5, "1", 2**31])
def test_a_priority_is_an_integer_within_the_tickets_range(priority: object) -> None:
    with pytest.raises(ConfigurationError, match="priority is an integer"):
        ConcurrencyLimiter(1).hold("k", priority=priority)  # type: ignore[arg-type]

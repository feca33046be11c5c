"""Many callers on one key of the memory store admit exactly the limit: 8 threads
in a process (in each of 2 processes, each store its own), many tasks on
`AsyncMemoryStore`, and event loops in 8 threads sharing one. Every algorithm;
a frozen clock, so nothing refills while they run."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ratewarden import AsyncLimiter, AsyncMemoryStore, FakeClock, MemoryStore
from tests.stores.contention import ALL, HITS, LIMIT, THREADS, admitted, hammer, limiter, switching


@pytest.mark.parametrize("algorithm", ALL)
def test_eight_threads_on_one_key_admit_exactly_the_limit(algorithm: str) -> None:
    store = MemoryStore(clock=FakeClock())
    assert hammer(limiter(store, "threads", algorithm)) == LIMIT  # of 1,200


@pytest.mark.parametrize("algorithm", ALL)
def test_in_each_of_two_processes_too(algorithm: str) -> None:
    assert admitted("memory", algorithm) == [LIMIT, LIMIT]  # a store per process


def async_limiter(store: AsyncMemoryStore, algorithm: str) -> AsyncLimiter:
    algo, _, mode = algorithm.partition("/")
    return AsyncLimiter(f"{LIMIT}/year", algorithm=algo, store=store, name="tasks",
                        refill="interval" if mode == "interval" else "continuous")  # fmt: skip


async def tasks(limit: AsyncLimiter, count: int, hits: int) -> int:
    """``count`` tasks of ``hits`` hits each, every hit a turn of the loop apart."""

    async def caller() -> int:
        allowed = 0
        for _ in range(hits):
            allowed += (await limit.hit("shared")).allowed
            await asyncio.sleep(0)
        return allowed

    return sum(await asyncio.gather(*(caller() for _ in range(count))))


@pytest.mark.parametrize("algorithm", ALL)
def test_many_tasks_on_one_key_admit_exactly_the_limit(algorithm: str) -> None:
    limit = async_limiter(AsyncMemoryStore(clock=FakeClock()), algorithm)
    assert asyncio.run(tasks(limit, 400, 3)) == LIMIT  # of 1,200


@pytest.mark.parametrize("algorithm", ALL)
def test_event_loops_in_eight_threads_sharing_one_store(algorithm: str) -> None:
    limit = async_limiter(AsyncMemoryStore(clock=FakeClock()), algorithm)
    allowed = [0] * THREADS
    start = threading.Barrier(THREADS)

    def work(i: int) -> None:
        start.wait()
        allowed[i] = asyncio.run(tasks(limit, 50, HITS // 50))

    workers = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    with switching():
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert sum(allowed) == LIMIT  # of 8 x 50 x 3 = 1,200

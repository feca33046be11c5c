"""Concurrency limits on a real Redis: never more than ``limit`` holds at once,
across threads and across processes, and every slot of a SIGKILLed holder back
within one lease."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratewarden import (
    AsyncConcurrencyLimiter,
    ConcurrencyLimiter,
    Hold,
    LeaseNotHeld,
    MemoryStore,
    RateLimitTimeout,
    StoreError,
)
from ratewarden.stores.leases import LeaseStore
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def redis_store(redis_single: RedisServer) -> Iterator[RedisStore]:
    with RedisStore(redis_single.url) as store:
        yield store


def overlap(limiter: ConcurrencyLimiter, threads: int, holds: int) -> tuple[int, int]:
    """Threads taking holds of one key, each counting itself in while it holds:
    the most inside at once, and the holds that got a slot."""
    inside, most, done = [0], [0], [0]
    lock = threading.Lock()

    def work() -> None:
        for _ in range(holds):
            try:
                with limiter.hold("k", max_wait=2.0):
                    with lock:
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                    time.sleep(0.0005)
                    with lock:
                        inside[0] -= 1
                        done[0] += 1
            except RateLimitTimeout:
                pass

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return most[0], done[0]


@pytest.mark.parametrize("kind", ["memory", "redis"])
@settings(max_examples=8, deadline=None)
@given(limit=st.integers(1, 4), threads=st.integers(2, 8))
def test_never_more_than_the_limit_across_threads(
    kind: str, limit: int, threads: int, request: pytest.FixtureRequest
) -> None:
    """The naive model: a count of the holders inside, which must never pass the
    limit; and with more threads than slots, the slots are all used at some point."""
    store: LeaseStore = MemoryStore()
    if kind == "redis":
        store = request.getfixturevalue("redis_store")
    limiter = ConcurrencyLimiter(
        limit, store=store, lease=5.0, name=f"threads-{os.urandom(4).hex()}"
    )
    most, done = overlap(limiter, threads, 20)
    assert most <= limit
    assert done == threads * 20  # max_wait is far longer than a hold: everyone got in
    assert most == min(limit, threads) or limit > 1  # one slot: exactly one at a time
    assert limiter.in_flight("k") == 0


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.concurrency.worker", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_never_more_than_the_limit_across_four_processes(redis_single: RedisServer) -> None:
    client = redis_single.client()
    client.delete("hammer:inside")
    workers = [_spawn("hammer", redis_single.url, "3", "2.0", "3") for _ in range(4)]
    results = []
    for w in workers:
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
        results.append(json.loads(out))
    assert max(r["most"] for r in results) <= 3, results
    assert max(r["most"] for r in results) == 3, results  # 12 threads do fill 3 slots
    assert all(r["holds"] > 0 for r in results), results
    assert int(client.get("hammer:inside") or 0) == 0


def test_every_slot_is_back_within_a_lease_after_its_holder_is_killed(
    redis_single: RedisServer,
) -> None:
    lease = 1.0
    workers = [_spawn("hold", redis_single.url, "4", str(lease)) for _ in range(4)]
    try:
        for w in workers:
            assert w.stdout is not None
            line = w.stdout.readline()
            assert line == "held\n", (line, w.stderr.read() if w.stderr else "")
        with RedisStore(redis_single.url) as store:
            limiter = ConcurrencyLimiter(4, store=store, lease=lease, name="killed")
            time.sleep(1.5 * lease)  # past a lease: the holders' renewals keep their slots
            assert limiter.in_flight("k") == 4
            with pytest.raises(RateLimitTimeout):
                limiter.hold("k").__enter__()
            killed = time.monotonic()
            for w in workers:
                os.kill(w.pid, signal.SIGKILL)
            taken: list[Hold] = []
            back: list[float] = []
            while len(taken) < 4 and time.monotonic() - killed < 3 * lease:
                try:
                    taken.append(limiter.hold("k").__enter__())
                    back.append(time.monotonic() - killed)
                except RateLimitTimeout:
                    time.sleep(0.002)
            print(f"slots back after SIGKILL (lease {lease}s): {[round(b, 3) for b in back]}")
            assert len(taken) == 4, back
            # the last renewal was at most a third of a lease before the kill
            assert lease * 0.5 < back[0], back
            # within a lease of the kill; the margin is this loop's own lateness on
            # a loaded machine (2 ms polls), not the store's
            assert back[-1] <= lease + 0.2, back
            assert limiter.stats.reclaimed == 4
            for hold in taken:
                hold.release()
    finally:
        for w in workers:
            w.kill()
            w.communicate()


def test_a_hold_longer_than_its_lease_keeps_its_slot(redis_store: RedisStore) -> None:
    limiter = ConcurrencyLimiter(1, store=redis_store, lease=0.3, name="renewed")
    with limiter.hold("k") as hold:
        time.sleep(1.0)  # over three leases: renewed in the background
        assert limiter.in_flight("k") == 1
        with pytest.raises(RateLimitTimeout):
            limiter.hold("k").__enter__()
    assert hold.state == "released"
    assert limiter.stats.lost == 0
    assert limiter.in_flight("k") == 0


def test_a_waiter_gets_a_released_slot(redis_store: RedisStore) -> None:
    limiter = ConcurrencyLimiter(1, store=redis_store, lease=5.0, name="waited")
    first = limiter.hold("k").__enter__()
    timer = threading.Timer(0.1, first.release)
    timer.start()
    started = time.monotonic()
    with limiter.hold("k", max_wait=2.0):
        waited = time.monotonic() - started
    timer.join()
    assert 0.09 < waited < 0.5, waited


def test_release_twice_on_redis(redis_store: RedisStore) -> None:
    limiter = ConcurrencyLimiter(2, store=redis_store, lease=5.0, name="twice")
    with limiter.hold("k") as hold, limiter.hold("k"):
        limiter.release("k", hold.lease_id)
        with pytest.raises(LeaseNotHeld, match="released already"):
            limiter.release("k", hold.lease_id)
        assert limiter.in_flight("k") == 1
        with pytest.raises(LeaseNotHeld):
            hold.__exit__(None, None, None)
        assert limiter.in_flight("k") == 1


async def _cancelled(url: str) -> tuple[int, int]:
    async with AsyncRedisStore(url) as store:
        limiter = AsyncConcurrencyLimiter(1, store=store, lease=5.0, name="cancelled")
        entered = asyncio.Event()

        async def work() -> None:
            async with limiter.hold("k"):
                entered.set()
                await asyncio.sleep(10)

        task = asyncio.create_task(work())
        await entered.wait()
        inside = await limiter.in_flight("k")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await limiter.in_flight("k")
        # a waiter cancelled mid-wait leaves nothing behind either
        async with limiter.hold("k"):
            waiter = asyncio.create_task(_enter(limiter))
            await asyncio.sleep(0.05)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        await asyncio.sleep(0.05)  # the abandoned take's release, in the background
        return inside, after + await limiter.in_flight("k")


async def _enter(limiter: AsyncConcurrencyLimiter) -> None:
    async with limiter.hold("k", max_wait=5.0):
        pass


def test_async_cancellation_gives_the_slot_back(redis_single: RedisServer) -> None:
    assert asyncio.run(_cancelled(redis_single.url)) == (1, 0)


async def _async_overlap(url: str, limit: int) -> int:
    async with AsyncRedisStore(url) as store:
        limiter = AsyncConcurrencyLimiter(limit, store=store, lease=5.0, name="async-overlap")
        inside, most = 0, 0

        async def work() -> None:
            nonlocal inside, most
            for _ in range(10):
                async with limiter.hold("k", max_wait=5.0):
                    inside += 1
                    most = max(most, inside)
                    await asyncio.sleep(0.001)
                    inside -= 1

        await asyncio.gather(*(work() for _ in range(8)))
        assert await limiter.in_flight("k") == 0
        return most


def test_async_never_more_than_the_limit(redis_single: RedisServer) -> None:
    assert asyncio.run(_async_overlap(redis_single.url, 3)) == 3


def test_a_store_that_cannot_answer_raises() -> None:
    """No fail-open: a hold on an unreachable Redis is a StoreError, not a slot."""
    with RedisStore(f"redis://127.0.0.1:{free_port()}/0") as store:
        limiter = ConcurrencyLimiter(1, store=store, name="down")
        with pytest.raises(StoreError), limiter.hold("k"):
            pytest.fail("held a slot of a store that is down")
        assert limiter.stats.taken == 0

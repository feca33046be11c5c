"""The store's timeout bounds a whole decision, not each round trip within it.

Cases the fault suite's load does not pin down, each built so that the code it
guards makes a difference of a whole timeout or more (a shared virtual machine
stalls for up to ~100 ms at times; the margins are larger than that):

- a check queued behind a batch that hangs still answers within the timeout of
  its own submission (AsyncRedisStore batches: a check that waited for the one
  in flight must not then wait a whole timeout more);
- over a slow link (round trip well under the timeout), the first decision after
  Redis restarted (new connection, scripts gone) is still a real one, within the
  timeout: a reconnection and a script reload cost as few round trips as they can.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from ratewarden import AsyncLimiter, Limiter
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.faults.proxy import proxy
from tests.redis_server import redis_server


def name() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


MARGIN = 0.25  # scheduling and a machine's stalls; far less than what each case guards


def test_a_check_behind_a_hung_batch_answers_within_its_own_timeout() -> None:
    timeout = 1.0

    async def main(url: str, hang: Callable[[], object]) -> float:
        async with AsyncRedisStore(url, timeout=timeout) as store:
            limiter = AsyncLimiter("10/hour", store=store, name=name(), on_failure="fail_open")
            assert not (await limiter.hit("k")).degraded
            hang()
            first = asyncio.ensure_future(limiter.hit("k"))
            await asyncio.sleep(0.05)  # the first batch is in flight: this one waits
            start = time.monotonic()
            second = await limiter.hit("k")
            took = time.monotonic() - start
            assert (await first).degraded
            assert second.degraded
            assert second.allowed
            return took

    with redis_server() as server, proxy(server.port) as px:
        took = asyncio.run(main(px.url, lambda: px.set("blackhole")))
    # before: the first batch's timeout, then a whole one of its own (~1.95 s)
    assert took <= timeout + MARGIN, f"the queued check took {took:.3f}s"


RTT_SHARE = 0.3  # the slow link's round trip, as a share of the timeout


def test_after_a_restart_over_a_slow_link_the_first_sync_decision_is_real_and_timely() -> None:
    timeout = 0.5
    with redis_server() as server, proxy(server.port) as px:
        px.set("latency", timeout * RTT_SHARE / 2)
        with RedisStore(px.url, timeout=timeout) as store:
            limiter = Limiter("10/hour", store=store, name=name(), on_failure="fail_open")
            assert not limiter.hit("k").degraded
            server.kill()
            server.start()  # scripts and keys gone; the proxy drops its connections
            start = time.monotonic()
            decision = limiter.hit("k")
            took = time.monotonic() - start
    # before: CLIENT SETINFO twice, EVALSHA, SCRIPT LOAD, EVALSHA: 5 round trips
    assert not decision.degraded
    assert decision.remaining == 9  # a fresh server: this is its first hit
    assert took <= timeout + MARGIN / 2, f"the decision took {took:.3f}s"


def test_after_a_restart_over_a_slow_link_the_first_async_decision_is_real_and_timely() -> None:
    timeout = 0.5

    async def main(url: str, restart: Callable[[], None]) -> tuple[float, bool, int]:
        async with AsyncRedisStore(url, timeout=timeout) as store:
            limiter = AsyncLimiter("10/hour", store=store, name=name(), on_failure="fail_open")
            assert not (await limiter.hit("k")).degraded
            await asyncio.to_thread(restart)
            start = time.monotonic()
            decision = await limiter.hit("k")
            return time.monotonic() - start, decision.degraded, decision.remaining

    with redis_server() as server, proxy(server.port) as px:

        def restart() -> None:
            server.kill()
            server.start()

        px.set("latency", timeout * RTT_SHARE / 2)
        took, degraded, remaining = asyncio.run(main(px.url, restart))
    assert not degraded, f"degraded after {took:.3f}s"
    assert remaining == 9
    assert took <= timeout + MARGIN / 2, f"the decision took {took:.3f}s"

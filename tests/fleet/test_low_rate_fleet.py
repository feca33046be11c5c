"""A low total over many members, judged where it counts: at the provider.

48 `AsyncFleetQuota` members in 4 processes share 10 requests a second of a
provider that counts every aligned second of its own clock
(examples/fleet/provider.py). Their clocks are off by up to 100 ms either way,
spread evenly; 5 members, one or two in each process, have callers that offer
10 a second each, evenly spaced, and the other 43 stay idle. The idle members'
slivers of the total leave the busy ones fragments whose permits move from
window to window; paced, no provider second may get more than 10 all the same
(docs/fleet.md, "Pacing"), and the busy members use the total.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import multiprocessing as mp
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ratewarden import RateLimitTimeout, SystemClock
from ratewarden.fleet import AsyncFleetQuota, QuotaConfig
from tests.redis_server import RedisServer, redis_server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet"

# alone, after the parallel pass: its five processes keep both cores busy for 15 s,
# and the other tests that judge real time would pay for it
pytestmark = [pytest.mark.slow, pytest.mark.serial]

PROCESSES, PER_PROCESS, TOTAL = 4, 12, 10
BUSY = (0, 6, 12, 24, 36)  # members with callers: in every process
WARMUP, MEASURED = 4, 8  # seconds: grants settle, then the provider's seconds judged


class SkewedClock(SystemClock):
    """The machine's clock off by ``offset`` seconds, as a machine whose NTP is off."""

    def __init__(self, offset: float) -> None:
        self.offset_ns = round(offset * 1e9)

    def time_ns(self) -> int:
        return time.time_ns() + self.offset_ns


def member(index: int, url: str, port: int, skews: list[float], go: Any) -> None:
    """One process: its members, and callers for the busy ones, until it is stopped."""

    async def main() -> None:
        config = QuotaConfig(f"{TOTAL}/second", "fair_share")
        indices = range(index * PER_PROCESS, (index + 1) * PER_PROCESS)
        quotas = {
            i: AsyncFleetQuota(
                "low-rate",
                url,
                config=config,
                pace=True,
                clock=SkewedClock(skews[i]),
                member_id=f"member-{i}",
            )
            for i in indices
        }
        for quota in quotas.values():
            await quota.start()
        await asyncio.to_thread(go.wait)

        async def call(quota: AsyncFleetQuota) -> None:
            try:
                await quota.acquire(max_wait=1.0)
            except RateLimitTimeout:
                return
            await asyncio.to_thread(request)

        def request() -> None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("POST", "/jobs/x", body=b"{}")
            connection.getresponse().read()
            connection.close()

        async def callers(quota: AsyncFleetQuota) -> None:  # 10 a second, evenly spaced
            calls: set[asyncio.Task[None]] = set()
            due = time.monotonic()
            while True:
                task = asyncio.create_task(call(quota))
                calls.add(task)
                task.add_done_callback(calls.discard)
                due += 1 / TOTAL
                await asyncio.sleep(max(0.0, due - time.monotonic()))

        busy = [callers(quotas[i]) for i in indices if i in BUSY]
        await asyncio.gather(*busy, asyncio.Event().wait())

    asyncio.run(main())


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def test_no_provider_second_passes_a_low_total_over_48_members(server: RedisServer) -> None:
    processes: list[Any] = []
    provider = subprocess.Popen(
        [sys.executable, str(EXAMPLE / "provider.py"), "--limit", str(TOTAL)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert provider.stdout is not None
        port = int(provider.stdout.readline().rsplit(":", 1)[1])
        ctx = mp.get_context("spawn")
        go = ctx.Barrier(PROCESSES + 1)
        n = PROCESSES * PER_PROCESS
        skews = [-0.1 + 0.2 * i / (n - 1) for i in range(n)]  # spread over +-100 ms
        skews = skews[::2] + skews[1::2]  # each process gets clocks from both ends
        processes = [
            ctx.Process(target=member, args=(i, server.url, port, skews, go), daemon=True)
            for i in range(PROCESSES)
        ]
        for process in processes:
            process.start()
        go.wait(timeout=60)  # every member has joined
        started = time.time()
        time.sleep(WARMUP + MEASURED + 1)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/stats")
        stats = json.loads(connection.getresponse().read())
        connection.close()
    finally:
        for process in processes:
            process.terminate()
            process.join(10)
        provider.terminate()
        provider.wait(10)
        assert provider.stdout is not None
        provider.stdout.close()
    first = int(started) + WARMUP
    seconds = [stats["seconds"].get(str(s), [0, 0]) for s in range(first, first + MEASURED)]
    admitted = [ok for ok, _ in seconds]
    refused = sum(no for _, no in seconds)
    assert not refused, f"the provider refused {refused}: {seconds}"
    assert max(admitted) <= TOTAL, admitted
    assert sum(admitted) >= 0.9 * TOTAL * MEASURED, admitted

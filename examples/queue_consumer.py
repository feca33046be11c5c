"""A queue consumer that obeys a downstream limit, on simulated time.

Four asyncio workers take events from an `asyncio.Queue` (standing in for a
Kafka topic) and call a downstream API limited to 1,000 requests a second. They
share one `AsyncLimiter`: each call waits for its permit (``limiter.slot``) on
the event loop, so together the workers go exactly as fast as the limit allows,
and no faster. With a `FakeClock` the 3,000 events take 3 s of simulated time
and a few milliseconds of real time.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from itertools import pairwise

from ratewarden import AsyncLimiter, AsyncMemoryStore, FakeClock

EVENTS = 3_000
WORKERS = 4

clock = FakeClock(1_700_000_000)
downstream = AsyncLimiter(
    "1000/second", algorithm="gcra", burst=1, store=AsyncMemoryStore(clock=clock), name="downstream"
)
sent_at: list[int] = []
done_by: Counter[int] = Counter()


async def call_downstream(event: int) -> None:
    sent_at.append(clock.time_ns())  # a real consumer would send the event here


async def worker(number: int, queue: asyncio.Queue[int]) -> None:
    while True:
        event = await queue.get()
        try:
            async with downstream.slot("downstream", max_wait=math.inf):
                await call_downstream(event)
            done_by[number] += 1
        finally:
            queue.task_done()


async def main() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for event in range(EVENTS):
        queue.put_nowait(event)
    workers = [asyncio.create_task(worker(n, queue)) for n in range(WORKERS)]
    await queue.join()
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


if __name__ == "__main__":
    start = clock.time_ns()
    asyncio.run(main())
    span = (sent_at[-1] - start) / 1e9
    gaps = {b - a for a, b in pairwise(sent_at)}
    print(f"{len(sent_at)} events sent by {WORKERS} workers in {span:.3f} s of simulated time")
    print(f"rate: {(len(sent_at) - 1) / span:.0f} requests per second")
    print(f"gap between calls: {sorted(gaps)} ns")
    print("per worker:", [done_by[n] for n in range(WORKERS)])
    assert len(sent_at) == EVENTS
    assert gaps == {1_000_000}  # exactly 1 ms apart: 1,000 a second
    assert all(done_by[n] > 0 for n in range(WORKERS))

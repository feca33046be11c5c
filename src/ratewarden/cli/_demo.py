"""``ratewarden demo``: every algorithm on a fake clock, then ``acquire()`` in real time."""

from __future__ import annotations

import asyncio
import time

from .. import __version__
from ..algorithms import ALGORITHMS
from ..kernel import AsyncLimiter, Limiter
from ..primitives import FakeClock, RateLimitTimeout
from ..stores import MemoryStore

__all__ = ["demo"]


def demo() -> None:
    print(f"ratewarden {__version__}: every algorithm, 5 per second, a burst of 8 requests")
    print("at t=0 then one request every 100 ms (simulated time).\n")
    print(f"{'algorithm':<24}{'burst':<10}then at t = 0.1 s, 0.2 s, ... 2.0 s")
    print(f"{'':<34}" + "".join(f"{t:>5}" for t in ("0.5s", "1.0s", "1.5s", "2.0s")))
    for name in ALGORITHMS:
        clock = FakeClock()
        limiter = Limiter("5/second", algorithm=name, store=MemoryStore(clock=clock))
        burst = "".join("#" if limiter.hit("demo").allowed else "." for _ in range(8))
        marks = []
        for _ in range(20):
            clock.advance(0.1)
            marks.append("#" if limiter.hit("demo").allowed else ".")
        print(f"{name:<24}{burst:<10}{''.join(marks)}")
    print("\n# admitted   . denied\n")

    print("acquire(): 4 async workers share one '10/second' gcra limit, burst 1 (real time)")
    shared = AsyncLimiter("10/second", algorithm="gcra", burst=1)

    async def worker(n: int, start: float) -> None:
        for _ in range(3):
            await shared.acquire("downstream-api", max_wait=2.0)
            print(f"  {time.monotonic() - start:5.2f}s  worker {n} got a permit")

    async def main() -> None:
        start = time.monotonic()
        await asyncio.gather(*(worker(n, start) for n in range(4)))

    asyncio.run(main())
    once = Limiter("1/minute", algorithm="token_bucket")
    once.acquire("k", max_wait=0)
    try:
        once.acquire("k", max_wait=0.5)
    except RateLimitTimeout as exc:
        print(f"\nwhen no permit can come in time: RateLimitTimeout: {exc}")

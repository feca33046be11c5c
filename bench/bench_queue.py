"""A paced queue's releases under asyncio: how evenly they are spaced.

    .venv/bin/python bench/bench_queue.py                 # 100/s, 3 x 10 s, memory store
    .venv/bin/python bench/bench_queue.py --redis         # the same on a redis-server of its own
    .venv/bin/python bench/bench_queue.py --json out.json

Open loop, 3x oversubscribed: callers arrive evenly at three times the rate
(``--rate``, 100/s), each ``await queue.wait(key)`` in a task of its own, and a
line of ``--size`` (200) holds what the rate cannot release yet; the rest are
turned away (`QueueFull`). Each released caller notes ``loop.time()`` as it
wakes. Figures per run:

- spacing error: each gap between consecutive releases minus the interval
  (``period / limit``), p50 / p99 / max of its absolute value, in ms;
- rate: releases per second over the run's steady part (after the line filled);
- refusal: how long a refused ``enter`` took (it never waits), p99 in us;
- the fake clock's run: the same schedule on a `FakeClock`, where the slots
  must be exact to the nanosecond (the error is the queue's own, not sleeping's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from ratewarden import AsyncMemoryStore, AsyncPacedQueue, FakeClock, QueueFull


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(rate: int, size: int, seconds: float, store: Any) -> dict[str, Any]:
    queue = AsyncPacedQueue(f"{rate}/second", size=size, store=store, name="bench")
    await queue.reset("k")
    loop = asyncio.get_running_loop()
    released: list[float] = []
    refusals: list[float] = []

    async def caller() -> None:
        started = time.perf_counter()
        try:
            await queue.wait("k")
        except QueueFull:
            refusals.append(time.perf_counter() - started)
            return
        released.append(loop.time())

    tasks = []
    arrivals = round(3 * rate * seconds)
    start = loop.time()
    for n in range(arrivals):
        due = start + n / (3 * rate)
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(caller()))
    await asyncio.gather(*tasks)
    released.sort()
    interval = 1 / rate
    errors = [abs((b - a) - interval) * 1e3 for a, b in itertools.pairwise(released)]
    steady = [t for t in released if t >= start + 1.0]
    span = steady[-1] - steady[0] if len(steady) > 1 else 0.0
    return {
        "released": len(released),
        "refused": len(refusals),
        "spacing_ms_p50": percentile(errors, 0.5),
        "spacing_ms_p99": percentile(errors, 0.99),
        "spacing_ms_max": max(errors),
        "rate_per_s": (len(steady) - 1) / span if span else 0.0,
        "refusal_us_p99": percentile(refusals, 0.99) * 1e6 if refusals else None,
    }


async def fake_run(rate: int, size: int) -> dict[str, Any]:
    """All callers at one instant on a fake clock: the slots they are given."""
    clock = FakeClock()
    queue = AsyncPacedQueue(f"{rate}/second", size=size, store=AsyncMemoryStore(clock=clock))
    start = clock.time_ns()
    waits = await asyncio.gather(*(queue.enter("k") for _ in range(size + 1)))
    slots = sorted(start + round(w * 1e9) for w in waits)
    interval_ns = 1_000_000_000 // rate
    worst = max(abs((b - a) - interval_ns) for a, b in itertools.pairwise(slots))
    try:
        await queue.enter("k")
        full = False
    except QueueFull:
        full = True
    return {"slots": len(slots), "worst_spacing_error_ns": worst, "full_refused": full}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--redis", action="store_true", help="an AsyncRedisStore of its own")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {"fake": asyncio.run(fake_run(args.rate, args.size)), "runs": []}
    print("fake clock:", results["fake"])
    for n in range(args.runs):
        if args.redis:
            from tests.redis_server import redis_server  # noqa: PLC0415

            from ratewarden.stores.redis import AsyncRedisStore  # noqa: PLC0415

            async def on_redis(url: str) -> dict[str, Any]:
                async with AsyncRedisStore(url) as store:
                    return await run(args.rate, args.size, args.seconds, store)

            with redis_server() as server:
                figures = asyncio.run(on_redis(server.url))
        else:
            figures = asyncio.run(run(args.rate, args.size, args.seconds, AsyncMemoryStore()))
        results["runs"].append(figures)
        print(f"run {n + 1}:", {k: round(v, 3) if isinstance(v, float) else v
                                for k, v in figures.items()})  # fmt: skip
    p99 = [r["spacing_ms_p99"] for r in results["runs"]]
    print(f"spacing error p99 over runs: median {statistics.median(p99):.3f} ms,"
          f" worst {max(p99):.3f} ms")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""Reservations: what a reserve and its settle cost against one hit.

    .venv/bin/python bench/bench_reserve.py [--rounds N] [--ops N]

One key, a token bucket of a limit no run reaches, single thread, sync. Per
store (memory; Redis, on a redis-server of its own on a free loopback port) it
runs, interleaved in rounds:

- hit: ``limiter.hit(key, cost)``, the anchor;
- reserve+settle: ``limiter.reserve(key, cost=estimate)`` then
  ``r.settle(actual)`` with a different actual (the settle applies a delta);
- reserve+settle same: the actual equals the estimate, so the settle makes no
  store call.

and reports, per operation, the minimum over the rounds of the wall time and the
process's CPU time (``time.process_time``: on Redis it leaves out the server's
own work), and the ratio of each to the hit's. On Redis a reserve and a settle
are one script call each, so reserve+settle is two round trips to the hit's one.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.redis_server import redis_server

from ratewarden import Limiter, MemoryStore, Store
from ratewarden.stores.redis import RedisStore

RATE = "1000000000/second"


def runs(store: Store, name: str) -> dict[str, Callable[[], object]]:
    limiter = Limiter(RATE, algorithm="token_bucket", store=store, name=name)
    return {
        "hit": lambda: limiter.hit("k", 300),
        "reserve+settle": lambda: limiter.reserve("k", cost=500).settle(300),
        "reserve+settle same": lambda: limiter.reserve("k", cost=300).settle(300),
    }


def measure(run: Callable[[], object], ops: int) -> tuple[float, float]:
    """Microseconds an operation: wall, CPU."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(ops):
        run()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return wall / ops * 1e6, cpu / ops * 1e6


def bench(label: str, store: Store, rounds: int, ops: int) -> None:
    named = runs(store, label)
    for run in named.values():
        run()  # the scripts loaded, the key made
    best = {name: (float("inf"), float("inf")) for name in named}
    for _ in range(rounds):
        for name, run in named.items():
            wall, cpu = measure(run, ops)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    hit_wall, hit_cpu = best["hit"]
    print(f"{label}: minimum of {rounds} interleaved rounds of {ops} operations")
    print(f"  {'operation':<22}{'wall us':>9}{'x hit':>7}{'CPU us':>9}{'x hit':>7}")
    for name, (wall, cpu) in best.items():
        print(f"  {name:<22}{wall:9.2f}{wall / hit_wall:7.2f}{cpu:9.2f}{cpu / hit_cpu:7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=5000)
    args = parser.parse_args()
    bench("memory", MemoryStore(), args.rounds, args.ops)
    with redis_server() as server, RedisStore(server.url, timeout=5.0) as store:
        bench("redis", store, args.rounds, max(args.ops // 5, 1))


if __name__ == "__main__":
    main()

"""Two-tier counting against the plain (exact) Redis store: two processes, one Redis.

    .venv/bin/python bench/bench_two_tier.py [--seconds S]

Starts its own redis-server on a free loopback port. For each configuration two
worker processes call ``Limiter.hit`` as fast as they can for S seconds, on one
hot key, or spread over 100,000 keys, against a fixed window: one the traffic
stays under (100,000,000/s), and ones it overruns (so the figures include the
part near the limit, where checks go to Redis one by one, and the denials after
it). Reported per configuration:

- checks/s of the two processes together (wall time of the run);
- over-admission: the worst complete window's admitted count past the limit, as
  a fraction of the limit (summed over keys for the 100,000 keys);
- Redis calls per check: every script call the workers made (exact checks and
  syncs; a sync of more than 512 keys is several calls);
- CPU per check: the workers' process time, and redis-server's own time
  (``INFO commandstats``), in microseconds;
- admitted/s: all keys together, per complete one-second window;
- memory per key of the local tier (tracemalloc, 100,000 entries).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from tests.redis_server import redis_server

from ratewarden import Limiter
from ratewarden.stores.redis import RedisStore, TwoTierSettings

KEYS = 100_000


def worker(url: str, config: dict[str, Any], seconds: float, out: Any) -> None:
    settings = TwoTierSettings(sync_interval=config["interval"] or 0.05)
    store = RedisStore(url, two_tier=settings, timeout=1.0)
    calls = [0]
    call = store.scripts.call

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return call(*args)

    store.scripts.call = counted  # type: ignore[method-assign]
    limiter = Limiter(config["rate"], store=store, algorithm="fixed_window", name=config["name"],
                      two_tier=config["interval"] is not None)  # fmt: skip
    hit = limiter.hit
    keys = [f"k{i}" for i in range(config["keys"])]
    nkeys = len(keys)
    admitted: dict[tuple[int, int], int] = {}
    clock = time.time
    start_cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    checks = 0
    while True:
        for i in range(checks, checks + 4096):
            k = i % nkeys
            if hit(keys[k]).allowed:
                slot = (k, int(clock()))
                admitted[slot] = admitted.get(slot, 0) + 1
        checks += 4096
        if time.perf_counter() >= deadline:
            break
    wall = time.perf_counter() - start
    cpu = time.process_time() - start_cpu
    store.close()
    out.put((checks, wall, cpu, calls[0], admitted))


def server_usec(client: redis.Redis) -> float:
    stats = client.info("commandstats")
    return sum(v["usec"] for v in stats.values())  # type: ignore[union-attr]


def run(url: str, config: dict[str, Any], seconds: float) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    client.flushall()
    client.config_resetstat()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(url, config, seconds, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    server = server_usec(client)
    checks = sum(r[0] for r in results)
    wall = max(r[1] for r in results)
    cpu = sum(r[2] for r in results)
    calls = sum(r[3] for r in results)
    merged: dict[tuple[int, int], int] = {}
    for r in results:
        for slot, n in r[4].items():
            merged[slot] = merged.get(slot, 0) + n
    windows = sorted({w for _, w in merged})
    full = windows[1:-1]  # the first and last windows are cut by the run
    limit = config["limit"]
    worst = 0.0
    for window in full:
        over = sum(max(n - limit, 0) for (_, w), n in merged.items() if w == window)
        worst = max(worst, over / (limit * config["keys"]))
    return {
        "rate": checks / wall,
        "over": worst,
        "calls": calls / checks,
        "cpu": cpu / checks * 1e6,
        "server": server / checks,
        # all keys together, a complete window on average
        "admitted": sum(n for (_, w), n in merged.items() if w in full) / max(len(full), 1),
    }


def memory_per_key() -> float:
    with redis_server() as server:
        store = RedisStore(server.url, two_tier=TwoTierSettings(sync_interval=60))
        limiter = Limiter("5/second", store=store, algorithm="fixed_window", two_tier=True)
        engine, tier = store._local, limiter._tier
        assert engine is not None
        names = [f"k{i}" for i in range(KEYS)]
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for name in names:
            engine.entry(tier, name)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
        store.close()
        return grown / KEYS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    configs = []
    for keys, limit in ((1, 100_000_000), (1, 200_000), (KEYS, 100)):
        for interval in (None, 0.01, 0.05, 0.2):
            configs.append({
                "keys": keys, "limit": limit, "rate": f"{limit}/second", "interval": interval,
                "name": f"b{len(configs)}",
            })  # fmt: skip
    print(f"two processes, {args.seconds:.0f} s each configuration, fixed window")
    header = f"{'keys':>7} {'limit/s':>8} {'store':<16} {'checks/s':>10} {'over':>7} "
    header += f"{'calls/check':>12} {'client us':>10} {'server us':>10} {'admitted/s':>10}"
    print(header)
    with redis_server() as server:
        for config in configs:
            r = run(server.url, config, args.seconds)
            interval = config["interval"]
            name = "redis (exact)" if interval is None else f"two-tier {interval * 1000:.0f} ms"
            print(
                f"{config['keys']:>7} {config['limit']:>8} {name:<16} {r['rate']:>10,.0f} "
                f"{r['over']:>7.2%} {r['calls']:>12.5f} {r['cpu']:>10.2f} {r['server']:>10.3f} "
                f"{r['admitted']:>10,.0f}"
            )
    print(f"local tier memory: {memory_per_key():.0f} bytes per key ({KEYS:,} keys)")


if __name__ == "__main__":
    main()

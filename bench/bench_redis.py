"""Redis store: ratewarden vs `limits`' RedisStorage vs a raw EVALSHA round trip.

    .venv/bin/python bench/bench_redis.py [--rounds N] [--hits N]

Starts its own redis-server on a free loopback port (never the machine's shared one)
and runs every candidate against it, interleaved in rounds, single thread, sync;
reports the minimum and median microseconds per check over the rounds, and each
candidate's overhead over the raw round trip (a trivial script by SHA through the
same redis-py client: the floor any script-based limiter pays).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from limits import parse, storage, strategies
from limits.aio import storage as aio_storage
from limits.aio import strategies as aio_strategies
from tests.redis_server import redis_server

import redis
from ratewarden import AsyncLimiter, Limiter, hit_many
from ratewarden.stores.redis import AsyncRedisStore, RedisStore

KEYS = [f"{{user:{i}}}" for i in range(1000)]  # hash-tagged, as tiers in a cluster need


def candidates(url: str) -> dict[str, Callable[[str], object]]:
    client = redis.Redis.from_url(url)
    sha = client.script_load("return 1")
    out: dict[str, Callable[[str], object]] = {
        "raw EVALSHA (trivial script)": lambda k: client.evalsha(sha, 1, k)
    }
    store = RedisStore(client)
    for algorithm in ("fixed_window", "sliding_window_counter", "token_bucket", "gcra"):
        out[f"ratewarden {algorithm}"] = Limiter(
            "1000000000/hour", algorithm=algorithm, store=store, name=algorithm
        ).hit
    big = "1000000000/{}"
    tiers = [
        Limiter(big.format("second"), algorithm="token_bucket", store=store, name="t1"),
        Limiter(big.format("minute"), algorithm="sliding_window_counter", store=store, name="t2"),
        Limiter(big.format("hour"), algorithm="fixed_window", store=store, name="t3"),
        Limiter(big.format("day"), algorithm="gcra", store=store, name="t4"),
    ]
    out["ratewarden hit_many, 1 tier"] = lambda k: hit_many([(tiers[1], k)])
    out["ratewarden hit_many, 4 tiers"] = lambda k: hit_many([(t, k) for t in tiers])
    item = parse("1000000000/hour")
    for label, kind in (
        ("fixed_window", strategies.FixedWindowRateLimiter),
        ("moving_window", strategies.MovingWindowRateLimiter),
        ("sliding_window_counter", strategies.SlidingWindowCounterRateLimiter),
    ):
        # limits keys every strategy alike: a prefix each keeps them from colliding
        hit = kind(storage.RedisStorage(url, key_prefix=f"LIMITS-{label}")).hit
        out[f"limits {label}"] = lambda k, hit=hit: hit(item, k)
    return out


def server_time(admin: redis.Redis) -> float:
    """Microseconds Redis spent on the commands clients sent since the last reset
    (scripts' inner calls are inside their EVALSHA's time, so they are not added)."""
    stats = admin.info("commandstats")
    return sum(
        v["usec"] for k, v in stats.items() if k not in ("cmdstat_config", "cmdstat_info")
        and not k.startswith("cmdstat_time") and not k.startswith("cmdstat_get")
        and not k.startswith("cmdstat_set") and not k.startswith("cmdstat_del")
    )  # fmt: skip


async def async_rates(url: str, callers: int, per_caller: int) -> dict[str, float]:
    """Checks per second with ``callers`` concurrent tasks, ours and limits' async."""
    store = AsyncRedisStore(url)
    ours = AsyncLimiter("1000000000/hour", algorithm="fixed_window", store=store, name="async")
    item = parse("1000000000/hour")
    theirs = aio_strategies.FixedWindowRateLimiter(
        aio_storage.RedisStorage(f"async+{url}", implementation="redispy", key_prefix="LA")
    )
    candidates = {
        "ratewarden AsyncRedisStore fixed_window": ours.hit,
        "limits aio RedisStorage fixed_window (redis-py)": lambda k: theirs.hit(item, k),
    }
    rates: dict[str, float] = {}
    for label, hit in candidates.items():

        async def caller(i: int, hit: Callable[[str], object] = hit) -> None:
            for j in range(per_caller):
                await hit(KEYS[(i * per_caller + j) % len(KEYS)])  # type: ignore[misc]

        await asyncio.gather(*(caller(i) for i in range(callers)))  # warm-up
        best = 0.0
        for _ in range(3):
            start = time.perf_counter()
            await asyncio.gather(*(caller(i) for i in range(callers)))
            best = max(best, callers * per_caller / (time.perf_counter() - start))
        rates[label] = best
    await store.aclose()
    return rates


def ceiling(port: int, sha: str) -> float:
    """redis-benchmark's EVALSHA of the trivial script, 50 clients, pipelined 16 deep:
    what this server on this machine can do at all, for context."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return float("nan")
    out = subprocess.run(
        [exe, "-p", str(port), "-n", "200000", "-P", "16", "-q", "EVALSHA", sha, "0"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    found = re.findall(r"([0-9.]+) requests per second", out)
    return float(found[-1]) if found else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--hits", type=int, default=3000)
    args = parser.parse_args()
    keys = (KEYS * (args.hits // len(KEYS) + 1))[: args.hits]
    with redis_server() as server:
        funcs = candidates(server.url)
        for f in funcs.values():  # warm up: scripts loaded, connections made
            for k in KEYS[:50]:
                f(k)
        times: dict[str, list[float]] = {name: [] for name in funcs}
        server_us: dict[str, list[float]] = {name: [] for name in funcs}
        names = list(funcs)
        with server.client() as admin:
            for r in range(args.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    f = funcs[name]
                    gc.collect()
                    admin.config_resetstat()
                    start = time.perf_counter()
                    for k in keys:
                        f(k)
                    times[name].append((time.perf_counter() - start) / len(keys) * 1e6)
                    server_us[name].append(server_time(admin) / len(keys))
        rates = asyncio.run(async_rates(server.url, 64, 100))
        with server.client() as admin:
            top = ceiling(server.port, admin.script_load("return 1"))
    raw = min(times["raw EVALSHA (trivial script)"])
    print(f"sync, one thread, {args.hits} checks x {args.rounds} rounds, 1000 keys cycled")
    print("client: wall time per check; server: Redis's own time per check (commandstats,")
    print("every command a check sent, scripts' inner calls included)")
    print(f"{'candidate':<40}{'min us':>9}{'median':>9}{'over raw':>10}{'server us':>11}")
    for name in names:
        low = min(times[name])
        print(
            f"{name:<40}{low:>9.1f}{statistics.median(times[name]):>9.1f}{low - raw:>+10.1f}"
            f"{min(server_us[name]):>11.1f}"
        )
    one, four = (min(times[f"ratewarden hit_many, {n}"]) for n in ("1 tier", "4 tiers"))
    single = min(times["ratewarden sliding_window_counter"])
    print(
        f"\n4 tiers (token bucket, sliding counter, fixed window, gcra) in one call:"
        f" {four / single:.2f}x one hit() (sliding counter), {four / one:.2f}x hit_many of"
        " one tier"
    )
    print(f"\nredis-benchmark EVALSHA ceiling (trivial script, -P 16): {top:,.0f} requests/s")
    print("\nasync, one process, 64 concurrent callers x 100 checks, best of 3")
    base = rates["limits aio RedisStorage fixed_window (redis-py)"]
    for label, rate in rates.items():
        print(f"{label:<50}{rate:>10.0f} checks/s{rate / base:>8.1f}x limits")


if __name__ == "__main__":
    main()

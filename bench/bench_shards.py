"""Hot-key sharding: the load one hot key puts on each node of a Redis Cluster.

    .venv/bin/python bench/bench_shards.py                 # 5 s a run
    .venv/bin/python bench/bench_shards.py --seconds 10 --processes 4

Starts the 6-node test cluster of its own (3 masters, 3 replicas, free loopback
ports; see tests/redis_server.py). One key, "celebrity", is hammered for
``--seconds`` by ``--processes`` processes each calling ``Limiter.hit`` in a loop
(sync), then by one process running ``--concurrency`` coroutines that call
``AsyncLimiter.hit`` (async), with ``shards`` 1 and 6, side by side in one run.

Two limits: "under" (10^9 a minute, every check admitted: the load of checks)
and "over" (``--over`` a second, fixed window, well under what the clients send:
the load of a key that is mostly denied).

Per-node load: each master's ``INFO commandstats`` after ``CONFIG RESETSTAT`` at the
start of the run: the calls of the check scripts (EVALSHA, one per round trip to
that node) and their usec (which includes the commands they run). Busiest/mean is the busiest
master's figure over the mean of the three; 1.0 is perfectly even, 3.0 all on one.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis
from tests.redis_server import redis_cluster

from ratewarden import AsyncLimiter, Limiter
from ratewarden.stores.redis import AsyncRedisStore, RedisStore

KEY = "celebrity"
# The checks' script calls. (commandstats also counts the commands a script runs,
# and includes their time in the script's: the scripts' entries alone say it all.)
_SCRIPTS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall")


def masters(url_nodes: list[tuple[str, int]]) -> list[redis.Redis]:
    clients = []
    for host, port in url_nodes:
        client = redis.Redis(host=host, port=port)
        if client.info("replication")["role"] == "master":
            clients.append(client)
        else:
            client.close()
    return sorted(clients, key=lambda c: c.connection_pool.connection_kwargs["port"])


def load(client: redis.Redis) -> tuple[int, int]:
    calls = usec = 0
    for name, stats in client.info("commandstats").items():
        if name.startswith(_SCRIPTS):
            calls += int(stats["calls"])
            usec += int(stats["usec"])
    return calls, usec


def limiter_options(limit: str, shards: int, tag: str) -> dict[str, Any]:
    rate = "1000000000/minute" if limit == "under" else f"{ARGS.over}/second"
    return {"rate": rate, "algorithm": "fixed_window", "name": tag, "shards": shards}


def sync_worker(url: str, options: dict[str, Any], seconds: float, out: Any) -> None:
    store = RedisStore(url, timeout=1.0)
    limiter = Limiter(options.pop("rate"), store=store, **options)
    checks = 0
    per_second: Counter[int] = Counter()  # admitted, by the second (window) it fell in
    first = time.time()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            if limiter.hit(KEY).allowed:
                per_second[int(time.time())] += 1
        checks += 100
    store.close()
    out.put((checks, per_second, first, time.time()))


async def async_run(url: str, options: dict[str, Any], seconds: float) -> tuple[Any, ...]:
    async with AsyncRedisStore(url, timeout=1.0) as store:
        limiter = AsyncLimiter(options.pop("rate"), store=store, **options)
        checks = [0]
        per_second: Counter[int] = Counter()
        first = time.time()
        end = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < end:
                decision = await limiter.hit(KEY)
                checks[0] += 1
                if decision.allowed:
                    per_second[int(time.time())] += 1

        await asyncio.gather(*(worker() for _ in range(ARGS.concurrency)))
        return checks[0], per_second, first, time.time()


def async_worker(url: str, options: dict[str, Any], seconds: float, out: Any) -> None:
    out.put(asyncio.run(async_run(url, options, seconds)))


def run(url: str, nodes: list[redis.Redis], mode: str, limit: str, shards: int) -> dict[str, Any]:
    tag = f"bench-{mode}-{limit}-{shards}-{time.time_ns()}"
    options = limiter_options(limit, shards, tag)
    out: Any = mp.Queue()
    count = ARGS.processes if mode == "sync" else 1
    target = sync_worker if mode == "sync" else async_worker
    workers = [mp.Process(target=target, args=(url, dict(options), ARGS.seconds, out))
               for _ in range(count)]  # fmt: skip
    for node in nodes:
        node.config_resetstat()
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    results = [out.get() for _ in workers]
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - start
    loads = [load(node) for node in nodes]
    checks = sum(r[0] for r in results)
    per_second: Counter[int] = sum((r[1] for r in results), Counter())
    # the windows (seconds) every worker spent whole inside its run
    whole = range(int(max(r[2] for r in results)) + 1, int(min(r[3] for r in results)))
    inside = [per_second[w] for w in whole]
    calls = [c for c, _ in loads]
    usec = [u for _, u in loads]
    return {
        "mode": mode, "limit": limit, "shards": shards,
        "checks_per_s": checks / ARGS.seconds, "admitted": sum(per_second.values()),
        "windows": (min(inside), max(inside)) if inside else None,
        "checks": checks, "calls": calls, "usec": usec, "elapsed": elapsed,
        "calls_ratio": max(calls) / (sum(calls) / len(calls)),
        "usec_ratio": max(usec) / (sum(usec) / len(usec)),
        "calls_per_check": sum(calls) / checks,
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| client | limit | shards | checks/s | admitted | script calls per check |"
        " script calls per master | busiest/mean (calls) | script usec per master |"
        " busiest/mean (usec) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["limit"] == "under":
            admitted = f"{r['admitted']:,} of {r['checks']:,}"
        elif r["windows"] is None:
            admitted = "(no whole window)"
        else:
            admitted = f"{r['windows'][0]:,}-{r['windows'][1]:,} of {ARGS.over:,} a window"
        lines.append(
            f"| {r['mode']} | {r['limit']} | {r['shards']} | {r['checks_per_s']:,.0f} |"
            f" {admitted} | {r['calls_per_check']:.3f} |"
            f" {' / '.join(f'{c:,}' for c in r['calls'])} | **{r['calls_ratio']:.2f}** |"
            f" {' / '.join(f'{u:,}' for u in r['usec'])} | {r['usec_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    rows = []
    with redis_cluster() as cluster:
        url = cluster.url
        nodes = masters([("127.0.0.1", n.port) for n in cluster.nodes])
        assert len(nodes) == 3, "the test cluster has three masters"
        for mode in ("sync", "async"):
            for limit in ("under", "over"):
                for shards in (1, 6):
                    row = run(url, nodes, mode, limit, shards)
                    rows.append(row)
                    print(f"{mode} {limit} shards={shards}: {row['checks_per_s']:,.0f}/s,"
                          f" busiest/mean {row['calls_ratio']:.2f} (calls)"
                          f" {row['usec_ratio']:.2f} (usec)", flush=True)  # fmt: skip
        for node in nodes:
            node.close()
    print()
    print(table(rows))
    print(f"\n{ARGS.processes} sync processes; {ARGS.concurrency} coroutines;"
          f" {ARGS.seconds:g} s a run; 'over' is {ARGS.over:,}/second, fixed window;"
          " admitted (over): the least and most of a whole window inside the run")  # fmt: skip


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seconds", type=float, default=5.0)
parser.add_argument("--processes", type=int, default=2, help="sync client processes")
parser.add_argument("--concurrency", type=int, default=64, help="async coroutines")
parser.add_argument("--over", type=int, default=2000, help="the 'over' limit, per second")
ARGS = parser.parse_args()

if __name__ == "__main__":
    main()

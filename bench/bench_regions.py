"""Region splits in real time: a global limit over three regions, each its own Redis.

    .venv/bin/python bench/bench_regions.py                  # 60 s, refresh 1 s
    .venv/bin/python bench/bench_regions.py --refresh 0.5 --seconds 40
    .venv/bin/python bench/bench_regions.py --json out.json

Starts four redis-servers of its own on free loopback ports: three regions and a
home for the coordinator. One split is dynamic (a `RegionRebalancer` per region,
on threads), the other has static equal shares; both run side by side on the same
traffic: every request is checked by the region's dynamic limiter and by its
static one, each counting on its own keys.

Traffic: ``--total`` (1,000) a second global, demand ``--demand`` (1.2) times it,
open loop and evenly spaced, skewed 10:1:1 (us:eu:ap) for the first half, then
1:10:1. One thread per region sends its requests; a sampler reads every region's
limit in force (what its limiter applies) every 10 ms.

Figures: utilisation = admitted / min(total, demand) per whole second of the run,
steady (leaving out the first 5 s and the 5 s after the shift) and over the whole
run; the worst sum of the regional limits in force at a sample, and of each
region's peak limit over one window; the worst second's admissions; and the time
from the shift until every dynamic regional limit is within 2% of the total of
its target (fair share of the new demand).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.redis_server import redis_server

from ratewarden.fleet import RegionalLimiter, RegionRebalancer, RegionSplit
from ratewarden.fleet.alloc import allocate
from ratewarden.stores.redis import RedisStore

REGIONS = ("us", "eu", "ap")
SKEWS = ({"us": 10, "eu": 1, "ap": 1}, {"us": 1, "eu": 10, "ap": 1})


def run(args: argparse.Namespace, urls: list[str], home: str) -> dict[str, Any]:
    total: int = args.total
    seconds: int = args.seconds
    weights = dict.fromkeys(REGIONS, 1)
    tag = str(int(time.time()))
    dynamic = RegionSplit(f"bench-dyn-{tag}", f"{total}/second", weights, refresh=args.refresh,
                          lease=max(5.0, 2 * args.refresh))  # fmt: skip
    static = RegionSplit(f"bench-static-{tag}", f"{total}/second", weights, dynamic=False)
    stores = {r: RedisStore(urls[i], timeout=0.5) for i, r in enumerate(REGIONS)}
    dyn = {r: RegionalLimiter(dynamic, r, stores[r]) for r in REGIONS}
    sta = {r: RegionalLimiter(static, r, stores[r]) for r in REGIONS}
    rebalancers = [RegionRebalancer(dynamic, r, urls[i], home) for i, r in enumerate(REGIONS)]
    admitted: dict[str, dict[str, dict[int, int]]] = {"dynamic": {}, "static": {}}
    demand: dict[int, int] = {}
    for kind in admitted:
        admitted[kind] = {r: {} for r in REGIONS}
    start = float(int(time.time()) + 1)  # a whole second
    shift = start + seconds // 2
    end = start + seconds
    stop = threading.Event()
    samples: list[tuple[float, dict[str, int]]] = []

    def region(name: str) -> None:
        sent = 0
        while True:
            now = time.time()
            if now >= end:
                return
            rates = [args.demand * total * skew[name] / sum(skew.values()) for skew in SKEWS]
            due = int(rates[0] * (min(now, shift) - start) + rates[1] * max(0.0, now - shift))
            while sent < due:
                sent += 1
                second = int(time.time())
                demand[second] = demand.get(second, 0) + 1
                for kind, limiters in (("dynamic", dyn), ("static", sta)):
                    if limiters[name].hit("provider"):
                        counts = admitted[kind][name]
                        counts[second] = counts.get(second, 0) + 1
            time.sleep(0.001)

    def sampler() -> None:
        while not stop.wait(0.01):
            samples.append((time.time(), {r: dyn[r].limit for r in REGIONS}))

    for rebalancer in rebalancers:
        rebalancer.start()
        time.sleep(args.refresh / len(REGIONS))  # spread their refreshes
    time.sleep(max(0.0, start - time.time()))
    threads = [threading.Thread(target=region, args=(r,)) for r in REGIONS]
    threads.append(threading.Thread(target=sampler))
    for thread in threads:
        thread.start()
    for thread in threads[:-1]:
        thread.join()
    stop.set()
    threads[-1].join()
    for rebalancer in rebalancers:
        rebalancer.close()
    return figures(
        args,
        admitted=admitted,
        demand=demand,
        samples=samples,
        times=(start, shift, end),
        poll=dynamic.poll,
    )


def figures(
    args: argparse.Namespace,
    *,
    admitted: dict[str, dict[str, dict[int, int]]],
    demand: dict[int, int],
    samples: list[tuple[float, dict[str, int]]],
    times: tuple[float, float, float],
    poll: float,
) -> dict[str, Any]:
    total: int = args.total
    start, shift, end = times
    first, last = int(start), int(end) - 1
    steady = [s for s in range(first + 5, last + 1) if not int(shift) <= s < int(shift) + 5]
    every = list(range(first, last + 1))

    def utilisation(kind: str, window: list[int]) -> float:
        got = sum(admitted[kind][r].get(s, 0) for r in REGIONS for s in window)
        room = sum(min(total, demand.get(s, 0)) for s in window)
        return got / room if room else 0.0

    worst_sample = max(sum(limits.values()) for _, limits in samples)
    peaks: dict[int, dict[str, int]] = {}
    for at, limits in samples:
        peak = peaks.setdefault(int(at), dict.fromkeys(REGIONS, 0))
        for r in REGIONS:
            peak[r] = max(peak[r], limits[r])
    worst_window = max(sum(p.values()) for p in peaks.values())
    wants = [round(args.demand * total * SKEWS[1][r] / 12) for r in REGIONS]
    targets = dict(zip(REGIONS, allocate("fair_share", total, wants), strict=True))
    converged = None
    for at, limits in samples:
        near = all(abs(limits[r] - targets[r]) <= 0.02 * total for r in REGIONS)
        if at >= shift and near and converged is None:
            converged = at - shift
        elif not near:
            converged = None
    per_second = {
        kind: max(sum(admitted[kind][r].get(s, 0) for r in REGIONS) for s in every)
        for kind in admitted
    }
    return {
        "total": total,
        "demand": args.demand,
        "seconds": args.seconds,
        "refresh": args.refresh,
        "poll": poll,
        "utilisation_steady": {k: utilisation(k, steady) for k in admitted},
        "utilisation_whole": {k: utilisation(k, every) for k in admitted},
        "worst_sum_of_limits_sampled": worst_sample,
        "worst_sum_of_window_peaks": worst_window,
        "worst_second_admitted": per_second,
        "samples": len(samples),
        "converged_after_shift_s": converged,
        "targets_after_shift": targets,
        "limits_at_end": samples[-1][1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=1000)
    parser.add_argument("--demand", type=float, default=1.2)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--refresh", type=float, default=1.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(redis_server()) for _ in range(4)]
        result = run(args, [s.url for s in servers[:3]], servers[3].url)
    for key, value in result.items():
        print(f"{key:30} {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Two priority classes contending for one limit, 3x oversubscribed, in real time.

    .venv/bin/python bench/bench_priority.py                      # 20 s
    .venv/bin/python bench/bench_priority.py --seconds 10 --plot docs/priority-waits.png
    .venv/bin/python bench/bench_priority.py --json out.json

An `AsyncLimiter` of ``--rate`` (100/s) as GCRA (one permit every emission
interval, 10 ms; ``--burst`` 2, so that a permit granted a little late does not
lose the next one), ``spin`` 1.5 ms, on the memory store, under asyncio. Callers
arrive open loop, a Poisson process per class (``--arrivals even``: evenly
spaced), each ``await limiter.acquire(key, max_wait, priority=...)`` in a task
of its own: the high class at ``--high`` (50/s) with
max_wait 1 s, the low class at ``--low`` (250/s) with max_wait ``--low-wait``
(0.5 s): 300/s in all, three times the limit. Figures per class: the wait of
each caller served (p50, p99, max), how many were served and how many were told
they could not be (`RateLimitTimeout`), and how long after arriving they were
told (max); then the permits granted a second. ``--plot`` draws the waits of
both classes (their distribution) with matplotlib.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ratewarden import AsyncLimiter, AsyncMemoryStore, RateLimitTimeout


def arrival_times(per_second: float, seconds: float, kind: str, rng: random.Random) -> list[float]:
    """Evenly spaced, or a Poisson process (exponential gaps) of that rate."""
    if kind == "even":
        return [n / per_second for n in range(round(per_second * seconds))]
    times, at = [], rng.expovariate(per_second)
    while at < seconds:
        times.append(at)
        at += rng.expovariate(per_second)
    return times


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    limiter = AsyncLimiter(f"{args.rate}/second", algorithm="gcra", burst=args.burst,
                           spin=args.spin, store=AsyncMemoryStore(),
                           classes=["high", "low"])  # fmt: skip
    loop = asyncio.get_running_loop()
    waits: dict[str, list[float]] = {"high": [], "low": []}
    told: dict[str, list[float]] = {"high": [], "low": []}
    granted: list[float] = []
    max_wait = {"high": 1.0, "low": args.low_wait}

    async def caller(cls: str) -> None:
        arrived = loop.time()
        try:
            await limiter.acquire("api", max_wait[cls], priority=cls)
        except RateLimitTimeout:
            told[cls].append(loop.time() - arrived)
            return
        now = loop.time()
        waits[cls].append(now - arrived)
        granted.append(now)

    async def arrivals(cls: str, per_second: float) -> list[asyncio.Task[None]]:
        tasks = []
        start = loop.time()
        times = arrival_times(per_second, args.seconds, args.arrivals, random.Random(cls))
        for at in times:
            delay = start + at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(caller(cls)))
        return tasks

    high, low = await asyncio.gather(arrivals("high", args.high), arrivals("low", args.low))
    await asyncio.gather(*high, *low)
    granted.sort()
    span = granted[-1] - granted[0] if len(granted) > 1 else 1.0
    interval = 1 / args.rate
    out: dict[str, Any] = {"interval_ms": interval * 1e3, "granted_per_s": len(granted) / span}
    for cls in ("high", "low"):
        served = waits[cls]
        out[cls] = {
            "served": len(served),
            "told": len(told[cls]),
            "wait_ms_p50": percentile(served, 0.5) * 1e3,
            "wait_ms_p99": percentile(served, 0.99) * 1e3,
            "wait_ms_max": max(served, default=float("nan")) * 1e3,
            "told_after_ms_max": max(told[cls], default=0.0) * 1e3,
            "max_wait_ms": max_wait[cls] * 1e3,
        }
    out["waits"] = waits
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=90)
    interval = results["interval_ms"]
    for cls, colour in (("high", "tab:blue"), ("low", "tab:orange")):
        values = sorted(w * 1e3 for w in results["waits"][cls])
        if not values:
            continue
        share = [(i + 1) / len(values) for i in range(len(values))]
        ax.plot(values, share, color=colour, label=f"{cls} class ({len(values)} served)")
    ax.axvline(interval, color="grey", linestyle="--", linewidth=1)
    ax.text(interval, 0.9, " one emission interval", color="grey", fontsize=8)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(left=0)
    ax.set_xlabel("wait for a permit (ms)")
    ax.set_ylabel("share of callers served")
    ax.set_title("100 permits/s, 300 callers/s: the high class waits under one interval")
    ax.legend(loc="center right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--high", type=float, default=50.0)
    parser.add_argument("--low", type=float, default=250.0)
    parser.add_argument("--low-wait", type=float, default=0.5)
    parser.add_argument("--burst", type=int, default=2)
    parser.add_argument("--spin", type=float, default=0.0015)
    parser.add_argument("--arrivals", choices=["poisson", "even"], default="poisson")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = asyncio.run(run(args))
    for cls in ("high", "low"):
        print(cls, {k: round(v, 3) for k, v in results[cls].items()})
    print(f"granted {results['granted_per_s']:.2f}/s, interval {results['interval_ms']:g} ms")
    if args.plot:
        plot(results, args.plot)
        print("plot:", args.plot)
    if args.json:
        args.json.write_text(json.dumps({k: v for k, v in results.items() if k != "waits"}))


if __name__ == "__main__":
    main()

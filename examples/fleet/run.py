"""Worker processes drain one queue into a provider, sharing its limit through a fleet quota.

    python examples/fleet/run.py --redis redis://127.0.0.1:6380/0

Starts the provider (provider.py: ``--limit`` requests a second by its own clock,
429 beyond) and ``--workers`` processes. Each worker holds one `FleetQuota`
member of one resource whose total is the provider's limit, and takes jobs from
a shared queue (jobs 0..N-1 behind a shared cursor) until it is empty: a permit
(``acquire``), then one request. A 429 is reported to the quota (``observe``) and
the job is sent again. Each worker's clock is off by a fixed amount, spread over
[-skew, +skew], as machines whose NTP disagrees.

Prints the provider's count for every second of its own clock, the 429s and the
drain time, then the verdict: paced (the default), no provider second may see
more than the limit plus one permit per worker (docs/fleet.md: paced, none sees
more than the limit while clocks are within 100 ms and requests arrive within 20
ms of their permits; the permit per worker is for a busy machine's delays).
Exits 1 when a second was over that, or the queue did not drain.

``--unshared`` shows what goes wrong without coordination: every worker gets a
resource of its own with the provider's whole limit.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from skewed_clock import SkewedClock, offsets

from ratewarden import RateLimitTimeout
from ratewarden.fleet import FleetQuota, QuotaConfig
from ratewarden.fleet.coordinator import keys

HERE = Path(__file__).resolve().parent


def take(cursor: Any, jobs: int) -> int | None:
    """The next job of the queue, or None when it is empty."""
    with cursor.get_lock():
        job: int = cursor.value
        if job >= jobs:
            return None
        cursor.value = job + 1
        return job


def worker(index: int, settings: dict[str, Any], cursor: Any, go: Any, results: Any) -> None:
    name = settings["name"] if settings["shared"] else f"{settings['name']}-{index}"
    config = QuotaConfig(f"{settings['limit']}/second", settings["algorithm"])
    clock = SkewedClock(settings["offsets"][index])
    connection = http.client.HTTPConnection("127.0.0.1", settings["port"], timeout=10)
    done = refused = 0
    with FleetQuota(
        name,
        settings["redis"],
        config=config,
        pace=settings["pace"],
        clock=clock,
        member_id=f"worker-{index}",
    ) as quota:
        go.wait()
        deadline = time.monotonic() + settings["timeout"]
        try:
            while (job := take(cursor, settings["jobs"])) is not None:
                while True:  # until the provider takes the job
                    quota.acquire(max_wait=max(0.0, deadline - time.monotonic()))
                    connection.request("POST", f"/jobs/{job}", body=b"{}")
                    response = connection.getresponse()
                    response.read()
                    if response.status != 429:
                        break
                    quota.observe(429)
                    refused += 1
                done += 1
        except RateLimitTimeout:
            pass  # out of time (--timeout): the queue is left undrained
        finished = time.time()
        grant = quota.grant
    connection.close()
    results.put(
        {"worker": index, "done": done, "refused": refused, "finished": finished, "grant": grant}
    )


def stats(port: int) -> dict[str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/stats")
    body: dict[str, Any] = json.loads(connection.getresponse().read())
    connection.close()
    return body


def run(args: argparse.Namespace) -> dict[str, Any]:
    provider = subprocess.Popen(
        [sys.executable, str(HERE / "provider.py"), "--limit", str(args.limit)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert provider.stdout is not None
        port = int(provider.stdout.readline().rsplit(":", 1)[1])
        settings = {
            "name": args.name,
            "shared": not args.unshared,
            "limit": args.limit,
            "algorithm": args.algorithm,
            "redis": args.redis,
            "pace": not args.no_pace,
            "jobs": args.jobs,
            "port": port,
            "offsets": offsets(args.workers, args.skew_ms / 1000),
            "timeout": args.timeout,
        }
        ctx = mp.get_context("spawn")
        cursor = ctx.Value("q", 0)
        go = ctx.Barrier(args.workers + 1)  # every member has joined: the drain starts
        results = ctx.Queue()
        workers = [
            ctx.Process(target=worker, args=(i, settings, cursor, go, results))
            for i in range(args.workers)
        ]
        for process in workers:
            process.start()
        go.wait(timeout=60)
        started = time.time()
        reports = sorted(
            (results.get(timeout=args.timeout + 30) for _ in workers), key=lambda r: r["worker"]
        )
        for process in workers:
            process.join(timeout=10)
        provider_stats = stats(port)
    finally:
        provider.terminate()
        provider.wait(timeout=10)
        if not args.keep:
            forget(args)

    seconds = [
        (int(s), ok, refused)
        for s, (ok, refused) in provider_stats["seconds"].items()
        if int(s) >= int(started)
    ]
    tolerance = args.workers if not args.no_pace else 0
    busiest = max((ok + refused for _, ok, refused in seconds), default=0)
    done = sum(r["done"] for r in reports)
    return {
        "name": args.name,
        "workers": args.workers,
        "limit": args.limit,
        "pace": not args.no_pace,
        "shared": not args.unshared,
        "skew_ms": args.skew_ms,
        "jobs": args.jobs,
        "done": done,
        "drained": done == args.jobs,
        "refused_429": sum(r["refused"] for r in reports),
        "drain_seconds": max(r["finished"] for r in reports) - started,
        "seconds": seconds,
        "busiest_second": busiest,
        "tolerance": tolerance,
        "within_limit": busiest <= args.limit + tolerance,
        "per_worker": reports,
    }


def forget(args: argparse.Namespace) -> None:
    """Delete the quotas the run made, as `ratewarden quota delete` would: a
    member keeps its quota's configuration in Redis for good, so that one run
    after another would leave a quota behind each time."""
    names = [args.name] if not args.unshared else [f"{args.name}-{i}" for i in range(args.workers)]
    client = redis.Redis.from_url(args.redis)
    try:
        client.delete(*(key for name in names for key in keys(name)))
    finally:
        client.close()


def show(result: dict[str, Any]) -> None:
    sharing = "one shared resource" if result["shared"] else "a resource EACH (unshared)"
    print(
        f"{result['workers']} workers, {sharing} {result['name']!r}, limit {result['limit']}/s,"
        f" {'paced' if result['pace'] else 'not paced'}, clocks skewed by up to"
        f" +-{result['skew_ms']:g} ms"
    )
    print("provider second   requests   of them 429")
    start = result["seconds"][0][0] if result["seconds"] else 0
    for second, ok, refused in result["seconds"]:
        print(f"  t+{second - start:<3} {time.strftime('%H:%M:%S', time.localtime(second))}"
              f"   {ok + refused:>8}   {refused:>11}")  # fmt: skip
    for report in result["per_worker"]:
        print(
            f"worker {report['worker']}: {report['done']} jobs, {report['refused']} 429s,"
            f" grant at the end {report['grant']:g}/s"
        )
    print(
        f"drained {result['done']}/{result['jobs']} jobs in {result['drain_seconds']:.2f} s;"
        f" 429s: {result['refused_429']}; busiest provider second: {result['busiest_second']}"
        f" (limit {result['limit']} + tolerance {result['tolerance']})"
    )
    verdict = result["within_limit"] and result["drained"]
    print("OK" if verdict else "FAILED: the provider's limit was overrun or the queue not drained")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", required=True, help="redis://HOST:PORT/DB")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--limit", type=int, default=200, help="the provider's requests a second")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--skew-ms", type=float, default=100.0, help="clocks off by up to this")
    parser.add_argument("--algorithm", default="fair_share")
    parser.add_argument("--no-pace", action="store_true", help="spend each second at its start")
    parser.add_argument("--unshared", action="store_true", help="a resource per worker")
    parser.add_argument("--name", default=f"fleet-example-{uuid.uuid4().hex[:6]}")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to drain, at most")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the run's quotas in Redis (ratewarden quota show NAME)",
    )
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        show(result)
    sys.exit(0 if result["within_limit"] and result["drained"] else 1)


if __name__ == "__main__":
    main()

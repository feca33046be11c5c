"""Fleet quotas for blocking workers, judged at the provider: processes whose
threads loop ``quota.acquire(max_wait)`` then send one request.

    .venv/bin/python bench/bench_fleet_blocking.py                  # every run (~4 min)
    .venv/bin/python bench/bench_fleet_blocking.py --runs pools,quiet
    .venv/bin/python bench/bench_fleet_blocking.py --json out.json

Starts a redis-server of its own on a free loopback port and, per run, a fresh
provider (examples/fleet/provider.py) that counts the requests of every aligned
second of its own clock and answers 429 beyond the total. Each worker process
holds one paced `FleetQuota` member (fair_share, refresh 1 s, lease 5 s) on a clock
off by a fixed offset, the offsets spread evenly over [-100, +100] ms; each of its
threads takes a permit and sends one request on a keep-alive connection. The runs:

- ``pools``: 4 processes x 8 blocking threads on 500/s, 25 s. Each process's rate
  (its own count of answered requests) from second 5 on, the provider's seconds.
- ``mixed``: 2 processes x 8 blocking threads beside 2 open-loop processes offering
  50 a second each (``acquire(max_wait=0.25)`` per arrival, in order), 25 s.
- ``start``: 4 x 8 blocking joining together: the provider's first whole second
  after all four joined, over the total; then a fifth process joins at 8 s: the
  seconds until its own rate reaches 90% of its fair share (100 of 500).
- ``quiet``: 4 x 8 blocking; process 0 stops its threads at 10 s: the seconds from
  then until the first whole provider second that holds 95% of the total again
  starts, and until it ends (5 runs: every one, the medians).
- ``away``: 4 x 8 blocking; Redis stopped (SIGSTOP: requests hang, as on a lost
  network) at 8 s for a lease + 3 s: provider seconds over the total, the largest
  sum of the members' grants sampled every 20 ms, and the time from Redis answering
  until a member's grant moves.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "fleet"))
sys.path.insert(0, str(ROOT))

from skewed_clock import SkewedClock  # noqa: E402
from tests.redis_server import redis_server  # noqa: E402

from ratewarden import RateLimitTimeout  # noqa: E402
from ratewarden.fleet import FleetQuota, QuotaConfig  # noqa: E402

PROVIDER = ROOT / "examples" / "fleet" / "provider.py"
RUNS = ("pools", "mixed", "start", "quiet", "away")


def worker(spec: dict[str, Any], grants: Any, ready: Any, out: Any) -> None:  # noqa: PLR0915
    """One member: blocking threads, or one open-loop arrival stream."""
    stop = threading.Event()
    quiet = threading.Event()
    counts: Counter[int] = Counter()
    lock = threading.Lock()
    quota = FleetQuota(
        spec["name"],
        spec["redis"],
        config=QuotaConfig(f"{spec['total']}/second", "fair_share", refresh=1.0, lease=5.0),
        clock=SkewedClock(spec["offset"]),
        pace=True,
        member_id=f"p{spec['index']}",
        timeout=0.2,
    )

    def send(connection: http.client.HTTPConnection) -> None:
        connection.request("POST", "/job", body=b"{}")
        response = connection.getresponse()
        response.read()
        if response.status == 200:
            with lock:
                counts[time.time_ns() // 10**9] += 1

    def blocking() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", spec["port"], timeout=10)
        while not stop.is_set():
            if quiet.is_set():
                time.sleep(0.01)
                continue
            try:
                quota.acquire(max_wait=5)
            except RateLimitTimeout as exc:
                time.sleep(min(exc.retry_after, 0.5))
                continue
            send(connection)

    def open_loop() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", spec["port"], timeout=10)
        gap = 1 / spec["rate"]
        due = time.monotonic()
        while not stop.is_set():
            due += gap
            with contextlib.suppress(RateLimitTimeout):
                quota.acquire(max_wait=max(0.0, due - time.monotonic() + 0.25 - gap))
                send(connection)
            time.sleep(max(0.0, due - time.monotonic()))

    def sample() -> None:
        while not stop.is_set():
            grants[spec["index"]] = quota.grant
            time.sleep(0.02)

    time.sleep(spec.get("join_at", 0.0))
    quota.start()
    threads = [threading.Thread(target=sample, daemon=True)]
    if spec["mode"] == "open":
        threads.append(threading.Thread(target=open_loop, daemon=True))
    else:
        threads += [threading.Thread(target=blocking, daemon=True) for _ in range(spec["threads"])]
    joined = time.time()
    ready.put(spec["index"])
    for thread in threads:
        thread.start()
    end = spec["end"]
    if spec.get("quiet_at") is not None:
        time.sleep(max(0.0, spec["quiet_at"] - time.time()))
        quiet.set()
    time.sleep(max(0.0, end - time.time()))
    stop.set()
    for thread in threads:
        thread.join(timeout=6)
    quota.close()
    out.put({"index": spec["index"], "joined": joined, "counts": dict(counts)})


@contextlib.contextmanager
def provider(limit: int) -> Iterator[int]:
    process = subprocess.Popen(
        [sys.executable, str(PROVIDER), "--limit", str(limit)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    try:
        yield int(process.stdout.readline().rsplit(":", 1)[1])
    finally:
        process.terminate()
        process.wait(timeout=10)


def provider_seconds(port: int) -> dict[int, int]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/stats")
    stats = json.loads(connection.getresponse().read())
    connection.close()
    return {int(s): ok for s, (ok, _refused) in stats["seconds"].items()}


def fleet(
    url: str,
    specs: list[dict[str, Any]],
    total: int,
    seconds: float,
    during: Any = None,
) -> dict[str, Any]:
    """Run the members; ``during(start, grants)`` runs in the parent meanwhile."""
    ctx = mp.get_context("spawn")
    name = f"blocking-{os.getpid()}-{time.monotonic_ns()}"
    grants = ctx.Array("d", len(specs))
    ready, out = ctx.Queue(), ctx.Queue()
    with provider(total) as port:
        start = time.time() + 3  # for the processes to import
        offsets = [-0.1 + 0.2 * i / max(1, len(specs) - 1) for i in range(len(specs))]
        processes = []
        for i, spec in enumerate(specs):
            full = {"name": name, "redis": url, "total": total, "port": port, "index": i,
                    "offset": offsets[i], "end": start + seconds, "threads": 8, **spec}  # fmt: skip
            if "join_at" in spec:
                full["join_at"] = start + spec["join_at"] - time.time()
            if spec.get("quiet_at") is not None:
                full["quiet_at"] = start + spec["quiet_at"]
            process = ctx.Process(target=worker, args=(full, grants, ready, out))
            process.start()
            processes.append(process)
        extra = during(start, grants) if during is not None else None
        results = sorted((out.get(timeout=seconds + 60) for _ in specs), key=lambda r: r["index"])
        for process in processes:
            process.join(timeout=10)
        counted = provider_seconds(port)
    return {"start": start, "members": results, "provider": counted, "extra": extra}


def rate_from(member: dict[str, Any], first: int, last: int) -> float:
    counts = {int(k): v for k, v in member["counts"].items()}
    return sum(counts.get(s, 0) for s in range(first, last)) / max(1, last - first)


def whole_seconds(result: dict[str, Any], after: float) -> list[tuple[int, int]]:
    """The provider's whole seconds from ``after`` to the run's last full one."""
    provider = result["provider"]
    last = max(provider, default=0)
    return [(s, provider.get(s, 0)) for s in range(int(after) + 1, last)]


def run_pools(url: str) -> dict[str, Any]:
    r = fleet(url, [{"mode": "blocking"}] * 4, 500, 25)
    first = int(r["start"]) + 5
    last = int(r["start"]) + 25
    rates = [rate_from(m, first, last) for m in r["members"]]
    seconds = [ok for s, ok in whole_seconds(r, first - 1) if s < last]
    return {
        "rates": [round(x, 1) for x in rates],
        "worst_off_fair_pct": round(max(abs(x - 125) / 125 for x in rates) * 100, 1),
        "utilisation": round(sum(seconds) / (500 * len(seconds)), 4),
        "seconds_over": sum(ok > 500 for ok in seconds),
        "busiest": max(seconds),
    }


def mean_grants(start: float, grants: Any, first: float, last: float) -> list[float]:
    """Each member's grant, sampled every 20 ms from ``first`` to ``last`` s, averaged."""
    samples = []
    time.sleep(max(0.0, start + first - time.time()))
    while time.time() < start + last:
        samples.append(list(grants))
        time.sleep(0.02)
    return [round(statistics.fmean(column), 1) for column in zip(*samples, strict=True)]


def run_mixed(url: str) -> dict[str, Any]:
    specs = [{"mode": "blocking"}] * 2 + [{"mode": "open", "rate": 50}] * 2
    r = fleet(url, specs, 500, 25, lambda start, grants: mean_grants(start, grants, 5, 24))
    first, last = int(r["start"]) + 5, int(r["start"]) + 25
    rates = [rate_from(m, first, last) for m in r["members"]]
    seconds = [ok for s, ok in whole_seconds(r, first - 1) if s < last]
    return {
        "rates": [round(x, 1) for x in rates],
        "mean_grants": r["extra"],
        "utilisation": round(sum(seconds) / (500 * len(seconds)), 4),
        "seconds_over": sum(ok > 500 for ok in seconds),
    }


def run_start(url: str) -> dict[str, Any]:
    specs: list[dict[str, Any]] = [{"mode": "blocking"}] * 4 + [{"mode": "blocking", "join_at": 8}]
    r = fleet(url, specs, 500, 16)
    joined = max(m["joined"] for m in r["members"][:4])
    first_whole = whole_seconds(r, joined)[0]
    late = r["members"][4]
    counts = {int(k): v for k, v in late["counts"].items()}
    reached = next(
        (s - late["joined"] for s in sorted(counts) if s > late["joined"] and counts[s] >= 90),
        None,
    )
    seconds = whole_seconds(r, joined)
    return {
        "first_whole_second": first_whole[1],
        "first_whole_second_pct": round(first_whole[1] / 5, 1),
        "next_seconds": [ok for _, ok in seconds[1:4]],
        "late_joiner_90pct_after_s": None if reached is None else round(reached, 2),
        "late_joiner_rates": [
            counts.get(s, 0) for s in range(int(late["joined"]), int(late["joined"]) + 5)
        ],
        "seconds_over": sum(ok > 500 for _, ok in seconds),
    }


def run_quiet(url: str, runs: int) -> dict[str, Any]:
    backs = []
    over = 0
    for _ in range(runs):
        specs = [{"mode": "blocking", "quiet_at": 10}] + [{"mode": "blocking"}] * 3
        r = fleet(url, specs, 500, 18)
        quiet = r["start"] + 10
        seconds = whole_seconds(r, quiet)
        over += sum(ok > 500 for _, ok in seconds)
        # the first whole provider second at 95% or more: from the quiet moment
        # to its start (the provider counts it full from there) and to its end
        back = next((s - quiet for s, ok in seconds if ok >= 475), None)
        backs.append(None if back is None else round(back, 2))
    known = [b for b in backs if b is not None]
    return {
        "first_95pct_second_starts_after_s": backs,
        "median_start_s": statistics.median(known) if known else None,
        "median_end_s": statistics.median(known) + 1 if known else None,
        "seconds_over": over,
    }


def run_away(url: str, pid: int) -> dict[str, Any]:
    stopped_for = 5.0 + 3.0

    def during(start: float, grants: Any) -> dict[str, Any]:
        worst = 0.0
        moved = None
        time.sleep(max(0.0, start + 8 - time.time()))
        os.kill(pid, signal.SIGSTOP)
        resumed = time.time() + stopped_for
        try:
            while time.time() < resumed:
                worst = max(worst, sum(grants))
                time.sleep(0.02)
        finally:
            os.kill(pid, signal.SIGCONT)
        before = list(grants)
        end = start + 25
        while time.time() < end:
            worst = max(worst, sum(grants))
            if moved is None and list(grants) != before:
                moved = time.time() - resumed
            time.sleep(0.02)
        return {"resumed": resumed, "max_grant_sum": worst, "moved_after_s": moved}

    r = fleet(url, [{"mode": "blocking"}] * 4, 500, 25, during)
    seconds = whole_seconds(r, r["start"] + 3)
    extra = r["extra"]
    after = [ok for s, ok in seconds if s >= extra["resumed"]][:4]
    return {
        "seconds_over": sum(ok > 505 for _, ok in seconds),
        "busiest": max(ok for _, ok in seconds),
        "max_grant_sum": round(extra["max_grant_sum"], 1),
        "grants_moved_after_s": None
        if extra["moved_after_s"] is None
        else round(extra["moved_after_s"], 2),
        "seconds_after_return": after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--quiet-runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with redis_server() as server:
        assert server.process is not None
        pid = server.process.pid
        for run in args.runs.split(","):
            if run == "pools":
                results[run] = run_pools(server.url)
            elif run == "mixed":
                results[run] = run_mixed(server.url)
            elif run == "start":
                results[run] = run_start(server.url)
            elif run == "quiet":
                results[run] = run_quiet(server.url, args.quiet_runs)
            elif run == "away":
                results[run] = run_away(server.url, pid)
            else:
                parser.error(f"unknown run {run!r}; expected some of {', '.join(RUNS)}")
            print(run, json.dumps(results[run]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

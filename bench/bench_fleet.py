"""Fleet quotas judged at the provider: 8 processes share 2,000/s under skewed demand.

    .venv/bin/python bench/bench_fleet.py                 # fleet (~75 s) then micro (~5 min)
    .venv/bin/python bench/bench_fleet.py --section fleet --no-pace  # unpaced, to compare
    .venv/bin/python bench/bench_fleet.py --section micro # the local acquire cost alone
    .venv/bin/python bench/bench_fleet.py --json out.json

Starts a redis-server of its own on a free loopback port, and per run a fresh
provider (examples/fleet/provider.py): it counts the requests of every aligned
second of its own clock, answers 429 beyond ``--total``. That count is the truth.

The fleet run, once per algorithm (fair_share, proportional_share, equal; each on a
fresh resource, one after another):

- ``--members`` consumer processes (8), each one `AsyncFleetQuota` member of the
  resource (``--total`` 2,000 a second), its clock off by a fixed offset; the
  offsets are spread evenly over [-``--skew-ms``, +``--skew-ms``] (100 ms).
- Open-loop demand, skewed 10:1: member 0 weighs 10, the others 1 each; member i
  offers ``demand * total * weight_i / sum(weights)`` requests a second (``--demand``
  1.25: 2,500 a second, member 0 1,470.6, the others 147.1 each), as evenly spaced
  arrivals whatever happens to earlier ones.
- Each arrival asks for one permit with ``acquire(max_wait)``, ``max_wait`` the time
  left of ``--max-wait`` (0.25 s) since it arrived; an arrival that times out is
  refused demand. A member serves its arrivals in order, one waiting at a time
  (many concurrent waiters all wake at every paced permit: see the report). An
  admitted arrival is one request on a keep-alive, pipelined HTTP/1.1 connection.
- ``--duration`` s of load (20); the first ``--warmup`` s (3) are left out of the
  figures: members join with an equal share's demand and their grants settle
  within two refreshes. Only whole provider seconds count.

Figures per run: provider seconds over the total (count, worst excess), utilisation
= admitted at the provider / min(total, offered), 429s, each member's admitted rate,
and the load generator's own health: offered vs attempted, how late each consumer's
event loop wakes (a task sleeping 5 ms, its overshoot: what a paced wait loses too),
and the CPU of consumers, provider and Redis against the machine's.

The micro section: one `FleetQuota` member of a resource of 2,000,000 a second with 95
other members registered (its grant: 2,000,000/96 = 20,833.3 a second). CPU time per
``try_acquire()`` and per ``acquire(0)``, over 10**6 calls, minimum of ``--rounds``:
granted (a clock that moves one paced interval per call, so that every call gets its
permit) and refused (the real clock, the window's permits long spent); beside
`limits`' MemoryStorage fixed and moving windows and `pyrate-limiter`'s InMemoryBucket
when they are installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import http.client
import importlib.metadata
import itertools
import json
import math
import multiprocessing as mp
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "fleet"))

import redis
from skewed_clock import SkewedClock, offsets
from tests.redis_server import redis_server

from ratewarden import RateLimitTimeout
from ratewarden.fleet import AsyncFleetQuota, Coordinator, FleetQuota, QuotaConfig

ROOT = Path(__file__).resolve().parent.parent
PROVIDER = ROOT / "examples" / "fleet" / "provider.py"
REQUEST = b"POST /push HTTP/1.1\r\nHost: provider\r\nContent-Length: 2\r\n\r\n{}"
ALGORITHMS = ("fair_share", "proportional_share", "equal")


# -- the consumers ----------------------------------------------------------------


class Pipeline(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; requests pipelined, responses counted."""

    def __init__(self) -> None:
        self.buffer = b""
        self.sent = 0
        self.statuses: Counter[int] = Counter()
        self.transport: asyncio.Transport | None = None
        self.drained = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self) -> None:
        assert self.transport is not None
        self.transport.write(REQUEST)
        self.sent += 1
        self.drained.clear()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data
        while (end := buffer.find(b"\r\n\r\n")) >= 0:
            head = buffer[:end]
            start = head.find(b"Content-Length: ") + 16
            length = int(head[start : head.find(b"\r\n", start)])
            if len(buffer) < end + 4 + length:
                break
            self.statuses[int(head[9:12])] += 1
            buffer = buffer[end + 4 + length :]
        self.buffer = buffer
        if self.statuses.total() >= self.sent:
            self.drained.set()


async def consume(spec: dict[str, Any], ready: Any) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    quota = AsyncFleetQuota(
        spec["name"],
        spec["redis"],
        config=QuotaConfig(f"{spec['total']}/second", spec["algorithm"]),
        pace=spec["pace"],
        clock=SkewedClock(spec["offset"]),
        member_id=f"consumer-{spec['index']}",
    )
    await quota.start()
    _, client = await loop.create_connection(Pipeline, "127.0.0.1", spec["port"])
    await loop.run_in_executor(None, ready.wait)  # every member has joined

    rate, max_wait, duration = spec["rate"], spec["max_wait"], spec["duration"]
    offered = math.ceil(duration * rate)  # arrivals k = 0..offered-1 at t0 + k / rate
    admitted = refused = late = 0
    per_second: Counter[int] = Counter()
    grants: list[float] = []
    cpu0, t0 = time.process_time(), loop.time()

    overshoots: list[float] = []

    async def sample() -> None:
        while True:
            grants.append(quota.grant)
            await asyncio.sleep(1.0)

    async def probe() -> None:  # how late this event loop wakes a sleeper
        while True:
            before = loop.time()
            await asyncio.sleep(0.005)
            overshoots.append(loop.time() - before - 0.005)

    samplers = [asyncio.create_task(sample()), asyncio.create_task(probe())]
    for k in range(offered):
        arrival = t0 + k / rate
        now = loop.time()
        if arrival > now:
            await asyncio.sleep(arrival - now)
            now = loop.time()
        left = arrival + max_wait - now
        if left <= 0:
            late += 1
        try:
            await quota.acquire(max(0.0, left))
        except RateLimitTimeout:
            refused += 1
            continue
        client.send()
        admitted += 1
        per_second[int(time.time())] += 1
    wall = loop.time() - t0
    cpu = time.process_time() - cpu0
    for task in samplers:
        task.cancel()
    overshoots.sort()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(client.drained.wait(), 5.0)
    assert client.transport is not None
    client.transport.close()
    await quota.aclose()
    return {
        "index": spec["index"],
        "offset": spec["offset"],
        "rate": rate,
        "offered": offered,
        "admitted": admitted,
        "refused": refused,
        "late": late,
        "wake_late_ms": {
            "mean": 1000 * statistics.mean(overshoots),
            "p99": 1000 * overshoots[len(overshoots) * 99 // 100],
        },
        "statuses": dict(client.statuses),
        "per_second": dict(per_second),
        "grants": grants,
        "wall": wall,
        "cpu": cpu,
    }


def consumer(spec: dict[str, Any], ready: Any, results: Any) -> None:
    results.put(asyncio.run(consume(spec, ready)))


# -- one run ----------------------------------------------------------------------


def start_provider(limit: int) -> tuple[subprocess.Popen[str], int]:
    provider = subprocess.Popen(
        [sys.executable, str(PROVIDER), "--limit", str(limit)], stdout=subprocess.PIPE, text=True
    )
    assert provider.stdout is not None
    return provider, int(provider.stdout.readline().rsplit(":", 1)[1])


def provider_stats(port: int) -> dict[str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/stats")
    stats: dict[str, Any] = json.loads(connection.getresponse().read())
    connection.close()
    return stats


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot (Linux; zeros elsewhere)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
    except OSError:
        return 0, 0
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def weights(members: int) -> list[int]:
    return [10] + [1] * (members - 1)


@dataclass
class Run:
    algorithm: str
    pace: bool
    total: int
    offered_rate: float
    seconds: list[tuple[int, int, int]]  # provider second, requests, of them 429
    consumers: list[dict[str, Any]]
    cpu: dict[str, float]
    wall: float
    warmup: float
    over: list[tuple[int, int]] = field(init=False)

    def __post_init__(self) -> None:
        self.over = [(s, n) for s, n, _ in self.seconds if n > self.total]

    @property
    def worst_excess(self) -> float:
        return max(((n - self.total) / self.total for _, n in self.over), default=0.0)

    @property
    def utilisation(self) -> float:
        room = min(self.total, self.offered_rate) * len(self.seconds)
        return sum(n for _, n, _ in self.seconds) / room if room else 0.0

    def member_rate(self, c: dict[str, Any]) -> float:
        measured = {s for s, _, _ in self.seconds}
        admitted = sum(n for s, n in c["per_second"].items() if int(s) in measured)
        return float(admitted) / max(1, len(measured))

    def as_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "pace": self.pace,
            "total": self.total,
            "offered_rate": self.offered_rate,
            "warmup_s": self.warmup,
            "measured_seconds": len(self.seconds),
            "seconds": self.seconds,
            "seconds_over": len(self.over),
            "worst_excess_pct": 100 * self.worst_excess,
            "utilisation": self.utilisation,
            "refused_429": sum(r for _, _, r in self.seconds),
            "member_rates": [self.member_rate(c) for c in self.consumers],
            "offered": sum(c["offered"] for c in self.consumers),
            "attempted_late": sum(c["late"] for c in self.consumers),
            "cpu": self.cpu,
            "consumers": self.consumers,
        }


def fleet_run(url: str, client: redis.Redis, algorithm: str, args: argparse.Namespace) -> Run:
    pace = not args.no_pace
    name = f"bench-fleet-{algorithm}-{uuid.uuid4().hex[:8]}"
    ws = weights(args.members)
    offered_rate = args.demand * args.total
    provider, port = start_provider(args.total)
    ctx = mp.get_context("spawn")
    ready = ctx.Barrier(args.members + 1)
    results = ctx.Queue()
    specs = [
        {
            "index": i,
            "name": name,
            "redis": url,
            "total": args.total,
            "algorithm": algorithm,
            "pace": pace,
            "offset": offset,
            "rate": offered_rate * w / sum(ws),
            "max_wait": args.max_wait,
            "duration": args.duration,
            "port": port,
        }
        for i, (w, offset) in enumerate(
            zip(ws, offsets(args.members, args.skew_ms / 1000), strict=True)
        )
    ]
    processes = [ctx.Process(target=consumer, args=(s, ready, results)) for s in specs]
    try:
        for process in processes:
            process.start()
        ready.wait(timeout=120)
        started = time.time()
        busy0, redis0, provider0 = machine_busy(), redis_cpu(client), provider_stats(port)["cpu"]
        consumers = sorted(
            (results.get(timeout=args.duration + 120) for _ in processes),
            key=lambda c: c["index"],
        )
        busy1, redis1 = machine_busy(), redis_cpu(client)
        stats = provider_stats(port)
        wall = time.time() - started
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        provider.terminate()
        provider.wait(timeout=10)
    first, last = math.ceil(started + args.warmup), math.floor(started + args.duration)
    seconds = [
        (int(s), ok + refused, refused)
        for s, (ok, refused) in stats["seconds"].items()
        if first <= int(s) < last
    ]
    jiffies = busy1[1] - busy0[1]
    cpu = {
        "consumers": sum(c["cpu"] for c in consumers),
        "consumer_max": max(c["cpu"] / c["wall"] for c in consumers),
        "provider": stats["cpu"] - provider0,
        "redis": redis1 - redis0,
        "machine_busy": (busy1[0] - busy0[0]) / jiffies if jiffies else math.nan,
        "load_wall": statistics.mean(c["wall"] for c in consumers),
    }
    return Run(
        algorithm, pace, args.total, offered_rate, seconds, consumers, cpu, wall, args.warmup
    )


def show_runs(runs: list[Run], args: argparse.Namespace) -> None:
    print(
        f"\n{args.members} consumer processes share {args.total}/s for {args.duration:g} s;"
        f" demand {args.demand:g}x the total, weights {weights(args.members)};"
        f" clocks spread over +-{args.skew_ms:g} ms; max_wait {args.max_wait:g} s;"
        f" {'paced' if not args.no_pace else 'NOT paced'}; first {args.warmup:g} s left out"
    )
    print(
        f"{'algorithm':<19}{'secs':>5}{'over':>5}{'worst %':>8}{'util':>8}{'429s':>6}"
        f"{'member 0/s':>11}{'others/s':>9}  CPU, cores of {mp.cpu_count()}: consumers (busiest),"
        " provider, redis; machine busy"
    )
    for run in runs:
        rates = [run.member_rate(c) for c in run.consumers]
        load = run.cpu["load_wall"]
        print(
            f"{run.algorithm:<19}{len(run.seconds):>5}{len(run.over):>5}"
            f"{100 * run.worst_excess:>8.2f}{100 * run.utilisation:>7.1f}%"
            f"{sum(r for _, _, r in run.seconds):>6}{rates[0]:>11.1f}"
            f"{statistics.mean(rates[1:]):>9.1f}"
            f"  {run.cpu['consumers'] / load:.2f} ({run.cpu['consumer_max']:.2f}),"
            f" {run.cpu['provider'] / run.wall:.2f}, {run.cpu['redis'] / run.wall:.2f};"
            f" {100 * run.cpu['machine_busy']:.0f}%"
        )
    for run in runs:
        counts = " ".join(str(n) for _, n, _ in run.seconds)
        print(f"  {run.algorithm}: provider seconds {counts}")
        cs = run.consumers
        offered = sum(c["offered"] for c in cs)
        attempted = sum(c["admitted"] + c["refused"] for c in cs)
        grants = [statistics.mean(c["grants"][round(args.warmup) :] or [0]) for c in cs]
        print(
            f"    offered {offered}, attempted {attempted}, admitted"
            f" {sum(c['admitted'] for c in cs)}, timed out {sum(c['refused'] for c in cs)}"
            f" ({sum(c['late'] for c in cs)} tried only after their deadline, behind earlier"
            " ones); mean grant member 0"
            f" {grants[0]:.0f}/s, others {statistics.mean(grants[1:]):.0f}/s; event loops"
            f" wake late by {statistics.mean(c['wake_late_ms']['mean'] for c in cs):.2f} ms"
            f" on average, p99 up to {max(c['wake_late_ms']['p99'] for c in cs):.1f} ms"
        )


# -- the micro-benchmark ----------------------------------------------------------


# paced, a member spends nothing this close to either edge of its window (docs/fleet.md)
EDGE_NS = 120_000_000


class CountingClock:
    """A clock that moves ``step_ns`` every time it is read (a C call, as
    time.time_ns is), so that every paced call lands on its permit; paced, it
    skips each second's edges, where no permit is spent, and its first slot."""

    def __init__(self, start_ns: int, step_ns: int, *, paced: bool = False) -> None:
        if not paced:
            self.time_ns = itertools.count(start_ns, step_ns).__next__
            return
        first = start_ns - start_ns % 10**9
        windows = itertools.count(first, 10**9)
        reads = (range(w + EDGE_NS + step_ns, w + 10**9 - EDGE_NS, step_ns) for w in windows)
        self.time_ns = itertools.chain.from_iterable(reads).__next__

    def sleep(self, seconds: float) -> None:
        raise AssertionError("the micro-benchmark never waits")

    async def asleep(self, seconds: float) -> None:
        raise AssertionError("the micro-benchmark never waits")


def cpu_per_call(f: Callable[[], object], calls: int, rounds: int) -> float:
    """Minimum over ``rounds`` of CPU ns per call of ``f``, ``calls`` calls a round."""
    best = math.inf
    loop = range(calls)
    for _ in range(rounds):
        gc.collect()
        start = time.process_time_ns()
        for _ in loop:
            f()
        best = min(best, (time.process_time_ns() - start) / calls)
    return best


def micro_member(url: str, client: redis.Redis, pace: bool, clock: Any) -> FleetQuota:
    """A member of a 2,000,000/s resource with 95 others registered."""
    name = f"bench-micro-{uuid.uuid4().hex[:8]}"
    config = QuotaConfig("2000000/second", "equal", lease=600.0)  # a 96th, whatever it asks
    coordinator = Coordinator(client, name)
    coordinator.set(config)
    equal = 2_000_000 * 1000 // 96  # millipermits a window

    def others(has: int) -> None:
        for i in range(95):
            coordinator.refresh(f"fake-{i:02d}", wants=equal, has=has, used=equal)

    others(0)  # joining, they hold nothing yet (holding some would start a rebuild)
    quota = FleetQuota(name, url, pace=pace, clock=clock, background=False)
    quota.start()
    others(equal)  # they make room for the new member, which takes it
    quota.refresh()
    return quota


def micro(url: str, client: redis.Redis, args: argparse.Namespace) -> dict[str, Any]:
    calls, rounds = args.calls, args.rounds
    out: dict[str, Any] = {}
    for pace in (True, False):
        probe = micro_member(url, client, pace, None)
        grant = probe.grant
        members = probe.local_status()["members"]
        probe.close()
        # granted: the clock moves one paced interval (a window over its permits,
        # paced: the part of it where permits are spent) per read
        span = 1e9 - 2 * EDGE_NS if pace else 1e9
        step = math.ceil(span / math.floor(grant))
        label = "paced" if pace else "unpaced"
        for method in ("try_acquire", "acquire(0)"):
            clock = CountingClock(time.time_ns(), step, paced=pace)
            quota = micro_member(url, client, pace, clock)
            f: Callable[[], object] = quota.try_acquire
            if method == "acquire(0)":
                f = functools.partial(quota.acquire, 0)
            for _ in range(2 * math.floor(grant)):  # its grant applies from the next window
                quota.try_acquire()
            assert all(quota.try_acquire() for _ in range(100_000)), "a call was refused"
            granted = cpu_per_call(f, calls, rounds)  # acquire(0) would raise if refused
            quota.close()
            quota = micro_member(url, client, pace, None)  # the real clock: spent out
            while quota.try_acquire():
                pass
            f = quota.try_acquire if method == "try_acquire" else _refused(quota)
            refused = cpu_per_call(f, calls, rounds)
            quota.close()
            out[f"ratewarden {method}, {label}"] = {"granted": granted, "refused": refused}
        out["grant"] = grant
        out["members"] = members
    out.update(anchors(calls, rounds))
    floor = cpu_per_call(_nothing, calls, rounds)
    out["floor (a call to a no-op function)"] = {"granted": floor, "refused": floor}
    return out


def _nothing() -> None:
    return None


def _refused(quota: FleetQuota) -> Callable[[], object]:
    def call() -> None:
        with contextlib.suppress(RateLimitTimeout):
            quota.acquire(0)

    return call


def anchors(calls: int, rounds: int) -> dict[str, Any]:
    """limits' memory windows and pyrate-limiter, if installed: granted (a limit that
    every call fits) and refused (20,834 a second, spent)."""
    out: dict[str, Any] = {}
    try:
        from limits import parse, storage, strategies  # noqa: PLC0415
    except ImportError:
        out["limits"] = "not installed"
    else:
        version = importlib.metadata.version("limits")
        memory = storage.MemoryStorage()
        fixed = strategies.FixedWindowRateLimiter(memory)
        # granted: a limit every call fits (a moving window's log would grow to 10**6
        # entries, each inserted at the front of a list: not measured)
        out[f"limits {version} FixedWindow"] = {
            "granted": cpu_per_call(_hit(fixed.hit, parse("1000000000/hour")), calls, rounds),
            "refused": cpu_per_call(_spent(fixed.hit, parse("20834/second")), calls, rounds),
        }
        moving = strategies.MovingWindowRateLimiter(memory)
        out[f"limits {version} MovingWindow"] = {
            "granted": None,
            "refused": cpu_per_call(_spent(moving.hit, parse("20834/second")), calls, rounds),
        }
    try:
        from pyrate_limiter import Duration, Limiter, Rate  # noqa: PLC0415
    except ImportError:
        out["pyrate-limiter"] = "not installed"
    else:
        version = importlib.metadata.version("pyrate-limiter")
        every = Limiter(Rate(10**9, Duration.HOUR))
        limited = Limiter(Rate(20834, Duration.SECOND))
        while limited.try_acquire("k", blocking=False):
            pass
        out[f"pyrate-limiter {version} InMemoryBucket"] = {
            "granted": cpu_per_call(
                lambda: every.try_acquire("k", blocking=False), calls, min(rounds, 2)
            ),
            "refused": cpu_per_call(
                lambda: limited.try_acquire("k", blocking=False), calls, rounds
            ),
        }
    return out


def _hit(hit: Callable[[Any, str], bool], item: Any) -> Callable[[], bool]:
    key = uuid.uuid4().hex
    return lambda: hit(item, key)


def _spent(hit: Callable[[Any, str], bool], item: Any) -> Callable[[], bool]:
    """A limiter whose window is spent: what a call costs when it is refused."""
    key = uuid.uuid4().hex
    while hit(item, key):
        pass
    return lambda: hit(item, key)


def show_micro(result: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\nLocal acquire cost: one member of 2,000,000/s over {result['members']} members"
        f" (grant {result['grant']:.1f}/s); CPU ns per call (time.process_time), minimum of"
        f" {args.rounds} rounds of {args.calls:,} calls; loop and call overhead included"
    )
    print(f"{'candidate':<46}{'granted':>10}{'refused':>10}")
    for label, row in result.items():
        if not isinstance(row, dict):
            if isinstance(row, str):
                print(f"{label:<46}{row:>20}")
            continue
        cells = [f"{row[k]:>10.0f}" if row.get(k) is not None else f"{'-':>10}" for k in
                 ("granted", "refused")]  # fmt: skip
        print(f"{label:<46}{''.join(cells)}")


# -- main -------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=("all", "fleet", "micro"), default="all")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--total", type=int, default=2000, help="permits a second")
    parser.add_argument("--demand", type=float, default=1.25, help="offered, times the total")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load a run")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds left out")
    parser.add_argument("--skew-ms", type=float, default=100.0)
    parser.add_argument("--max-wait", type=float, default=0.25)
    parser.add_argument("--no-pace", action="store_true")
    parser.add_argument("--calls", type=int, default=1_000_000, help="micro: calls a round")
    parser.add_argument("--rounds", type=int, default=5, help="micro: rounds")
    parser.add_argument("--json", metavar="PATH", help="write every figure as JSON here")
    args = parser.parse_args()
    print(
        f"{platform.python_implementation()} {platform.python_version()},"
        f" {platform.machine()}, {mp.cpu_count()} CPUs"
    )
    report: dict[str, Any] = {"args": vars(args)}
    with redis_server() as server, server.client() as client:
        if args.section in ("all", "fleet"):
            runs = [fleet_run(server.url, client, a, args) for a in args.algorithms.split(",")]
            show_runs(runs, args)
            report["fleet"] = [run.as_dict() for run in runs]
        if args.section in ("all", "micro"):
            result = micro(server.url, client, args)
            show_micro(result, args)
            report["micro"] = result
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

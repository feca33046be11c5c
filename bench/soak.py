"""Soak: steady load on ``ratewarden serve`` with the Redis store, for minutes, and
whether anything creeps: the server's memory, its descriptors, its latency.

    .venv/bin/python bench/soak.py                 # 10 minutes, ~11 min in all
    .venv/bin/python bench/soak.py --minutes 3 --rate 1000

It starts a redis-server of its own on a free loopback port and ``ratewarden
serve --store redis://...`` (``--pin``: the server on CPU 0 and this load
generator on CPU 1, as bench/bench_service.py does, whose clients it reuses; by
default nothing is pinned, since on a VM that other work shares a pinned server
cannot move off a busy core), then sends
``--rate`` checks a second, open loop, half HTTP ``POST /v1/check`` and half gRPC
``ShouldRateLimit``, each timed from the moment it was due. Every
``--sample`` seconds it reads the server's RSS (/proc/PID/status) and open
descriptors (/proc/PID/fd); every ``--window`` seconds (a minute) it reports p50
and p99, both as measured and outside the generator's own stalls (moments this
VM froze, see bench_service.latency), with errors and degraded answers.

Verdict, measured from the end of the warm-up (the first window) to the end:

- RSS grows less than ``--rss-growth`` (5%);
- the last window's p99 is within ``--p99-ratio`` (1.5x) of the first window's
  after the warm-up (both outside the stalls), or below ``--p99-floor`` ms;
- descriptors: no more at the end than after the warm-up;
- no errors (failed requests, gRPC errors, HTTP 5xx).

Degraded answers (the store timed out and the failure policy answered) are
counted and printed: on a VM that other work shares, a Redis round trip now and
then outlasts the store's 50 ms timeout.

Exits 0 when every point holds, 1 otherwise; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _bench_service() -> Any:
    """bench/bench_service.py, imported by path (bench/ is no package)."""
    name = "bench_service"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / "bench_service.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


service = _bench_service()

STALL = service.STALL  # a generator tick this late: the machine stalled
AFTER_STALL = service.AFTER_STALL


@dataclass
class Window:
    """One window's requests: when each was due and how long it took, by protocol."""

    index: int
    fired: dict[str, list[float]] = field(default_factory=lambda: {"http": [], "grpc": []})
    latency: dict[str, list[float]] = field(default_factory=lambda: {"http": [], "grpc": []})
    errors: int = 0
    degraded: int = 0  # HTTP answers marked degraded while the window's requests went out
    load: float = 0.0  # the machine's 1-minute load average at the window's end


@dataclass
class Sample:
    at: float  # seconds since the load began
    rss: int  # bytes
    fds: int


@dataclass
class Figures:
    """One window's summary."""

    window: int
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    p99_outside_stalls_ms: float
    p99_http_ms: float
    p99_grpc_ms: float
    rss_mib: float  # at the window's end
    fds: int
    degraded: int
    load: float


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] if ordered else 0.0


def rss_and_fds(pid: int) -> tuple[int, int]:
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Soak:
    rate: float
    seconds: float
    window: float
    sample: float
    windows: list[Window] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    stalls: list[tuple[float, float]] = field(default_factory=list)

    async def run(self, fires: dict[str, Callable[..., None]], pid: int) -> None:
        """Open loop at ``rate``: request i is due at t0 + i/rate, alternately HTTP
        and gRPC, whatever the answers before it did (no coordinated omission)."""
        loop = asyncio.get_running_loop()
        now = time.perf_counter
        total = int(self.rate * self.seconds)
        count = max(1, math.ceil(self.seconds / self.window - 1e-9))
        self.windows = [Window(i) for i in range(count)]
        finished = loop.create_future()
        done_count = [0]

        def record(window: Window, kind: str, fired: float, ok: bool) -> None:
            window.fired[kind].append(fired - t0)
            window.latency[kind].append(now() - fired)
            if not ok:
                window.errors += 1
            done_count[0] += 1
            if done_count[0] == total and not finished.done():
                finished.set_result(None)

        t0 = last = now()
        window, degraded = self.windows[0], service.DEGRADED[0]
        next_sample = 0.0
        i = 0
        while i < total:
            fired = now()
            if fired - last > STALL:
                self.stalls.append((last - STALL - t0, fired + AFTER_STALL - t0))
            last = fired
            if fired - t0 >= next_sample:
                rss, fds = rss_and_fds(pid)
                self.samples.append(Sample(fired - t0, rss, fds))
                next_sample += self.sample
            current = self.windows[min(int((fired - t0) // self.window), count - 1)]
            if current is not window:  # a window ends: what it saw of the machine
                window.degraded = service.DEGRADED[0] - degraded
                degraded, window.load = service.DEGRADED[0], os.getloadavg()[0]
                window = current
            due = min(total, int((fired - t0) * self.rate) + 1)
            while i < due:
                kind = "http" if i % 2 == 0 else "grpc"
                fires[kind](i // 2, functools.partial(record, window, kind, fired))
                i += 1
            await asyncio.sleep(0.001)
        async with asyncio.timeout(60):
            await finished
        window.degraded = service.DEGRADED[0] - degraded
        window.load = os.getloadavg()[0]
        rss, fds = rss_and_fds(pid)
        self.samples.append(Sample(now() - t0, rss, fds))

    def figures(self) -> list[Figures]:
        merged: list[list[float]] = []  # the stalls, overlaps joined, in order
        for start, end in sorted(self.stalls):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        starts = [start for start, _ in merged]

        def in_stall(at: float) -> bool:
            i = bisect.bisect_right(starts, at) - 1
            return i >= 0 and at <= merged[i][1]

        out = []
        for w in self.windows:
            every = w.latency["http"] + w.latency["grpc"]
            pairs = [*zip(w.fired["http"], w.latency["http"], strict=True),
                     *zip(w.fired["grpc"], w.latency["grpc"], strict=True)]  # fmt: skip
            clean = [lat for at, lat in pairs if not in_stall(at)]
            end = (w.index + 1) * self.window
            last = [s for s in self.samples if s.at <= end + self.sample / 2][-1]
            out.append(Figures(
                window=w.index + 1, requests=len(every), errors=w.errors,
                p50_ms=percentile(every, 0.50) * 1000, p99_ms=percentile(every, 0.99) * 1000,
                p99_outside_stalls_ms=percentile(clean, 0.99) * 1000,
                p99_http_ms=percentile(w.latency["http"], 0.99) * 1000,
                p99_grpc_ms=percentile(w.latency["grpc"], 0.99) * 1000,
                rss_mib=last.rss / 2**20, fds=last.fds, degraded=w.degraded, load=w.load,
            ))  # fmt: skip
        return out


@dataclass
class Verdict:
    rss_after_warmup_mib: float
    rss_end_mib: float
    rss_growth: float
    fds_after_warmup: int
    fds_end: int
    fds_max: int
    p99_first_ms: float  # the first window after the warm-up, outside stalls
    p99_last_ms: float
    p99_ratio: float
    errors: int
    degraded: int
    stalls: int
    failures: list[str]

    @property
    def ok(self) -> bool:
        return not self.failures


def verdict(soak: Soak, figures: list[Figures], degraded: int, args: Any) -> Verdict:
    warm = soak.window  # the first window is the warm-up
    after = [s for s in soak.samples if s.at >= warm]
    base = min(after, key=lambda s: s.at - warm)  # the sample nearest the warm-up's end
    end = soak.samples[-1]
    growth = (end.rss - base.rss) / base.rss
    first, last = figures[1] if len(figures) > 1 else figures[0], figures[-1]
    ratio = last.p99_outside_stalls_ms / max(first.p99_outside_stalls_ms, 1e-9)
    errors = sum(f.errors for f in figures)
    failures = []
    if growth >= args.rss_growth:
        failures.append(f"RSS grew {growth:.1%} (bound {args.rss_growth:.0%})")
    if ratio > args.p99_ratio and last.p99_outside_stalls_ms > args.p99_floor:
        failures.append(f"p99 went from {first.p99_outside_stalls_ms:.2f} to"
                        f" {last.p99_outside_stalls_ms:.2f} ms ({ratio:.2f}x,"
                        f" bound {args.p99_ratio}x)")  # fmt: skip
    if end.fds > base.fds:
        failures.append(f"descriptors went from {base.fds} to {end.fds}")
    if errors:
        failures.append(f"{errors} errors")
    return Verdict(
        rss_after_warmup_mib=base.rss / 2**20, rss_end_mib=end.rss / 2**20, rss_growth=growth,
        fds_after_warmup=base.fds, fds_end=end.fds, fds_max=max(s.fds for s in after),
        p99_first_ms=first.p99_outside_stalls_ms, p99_last_ms=last.p99_outside_stalls_ms,
        p99_ratio=ratio, errors=errors, degraded=degraded, stalls=len(soak.stalls),
        failures=failures,
    )  # fmt: skip


async def soak(args: Any, say: Callable[[str], None] = print) -> tuple[list[Figures], Verdict]:
    """Start Redis and the service, run the load, and judge it."""
    seconds = args.minutes * 60
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(service.redis_server())
        pid, http, grpc = stack.enter_context(serving(url, pin=args.pin))
        say(f"redis {url}, ratewarden serve pid {pid}: HTTP {http}, gRPC {grpc};"
            f" {args.rate:g} checks/s for {seconds:g} s")  # fmt: skip
        fire_http, close_http = await service.http_client(http, args.connections)
        fire_grpc, close_grpc = await service.grpc_client(grpc, args.connections)
        service.DEGRADED[0] = 0
        run = Soak(args.rate, seconds, args.window, args.sample)
        try:
            await run.run({"http": fire_http, "grpc": fire_grpc}, pid)
        finally:
            close_http()
            close_grpc()
            await asyncio.sleep(0.1)
    figures = run.figures()
    for f in figures:
        say(f"window {f.window:>2}: {f.requests:>7,} checks, p50 {f.p50_ms:.2f} ms, p99"
            f" {f.p99_ms:.2f} ms ({f.p99_outside_stalls_ms:.2f} outside stalls; HTTP"
            f" {f.p99_http_ms:.2f}, gRPC {f.p99_grpc_ms:.2f}), {f.errors} errors,"
            f" {f.degraded} degraded; RSS {f.rss_mib:.1f} MiB, {f.fds} fds;"
            f" load {f.load:.2f}")  # fmt: skip
    result = verdict(run, figures, service.DEGRADED[0], args)
    say(f"verdict: RSS {result.rss_after_warmup_mib:.1f} -> {result.rss_end_mib:.1f} MiB"
        f" ({result.rss_growth:+.1%}); fds {result.fds_after_warmup} -> {result.fds_end}"
        f" (max {result.fds_max}); p99 {result.p99_first_ms:.2f} -> {result.p99_last_ms:.2f} ms"
        f" ({result.p99_ratio:.2f}x, outside {result.stalls} stalls); {result.errors} errors,"
        f" {result.degraded} degraded: "
        + ("PASS" if result.ok else "FAIL: " + "; ".join(result.failures)))  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"figures": [asdict(f) for f in figures], "verdict": asdict(result),
             "samples": [asdict(s) for s in run.samples]}, indent=2))  # fmt: skip
    return figures, result


@contextlib.contextmanager
def serving(store: str, *, pin: bool) -> Iterator[tuple[int, int, int]]:
    """``ratewarden serve`` on free loopback ports: its pid, HTTP and gRPC ports."""
    http, grpc = service.free_port(), service.free_port()
    command = [str(service.RATEWARDEN), "serve", "--config", str(service.RULES),
               "--store", store, "--http", f"127.0.0.1:{http}", "--grpc", f"127.0.0.1:{grpc}",
               "--log-level", "warning"]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, {0})) if pin else None,  # noqa: PLW1509
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "HTTP on" not in line:
            raise SystemExit(f"ratewarden serve did not start: {line!r}")
        yield process.pid, http, grpc
    finally:
        process.terminate()
        process.wait(30)
        if process.stdout is not None:
            process.stdout.close()


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parse.add_argument("--minutes", type=float, default=10.0)
    parse.add_argument("--rate", type=float, default=2000.0,
                       help="checks a second, half HTTP, half gRPC")  # fmt: skip
    parse.add_argument("--window", type=float, default=60.0,
                       help="seconds per reported window; the first is the warm-up")  # fmt: skip
    parse.add_argument("--sample", type=float, default=5.0, help="seconds between RSS samples")
    parse.add_argument("--connections", type=int, default=32, help="HTTP keep-alive connections")
    parse.add_argument("--pin", action="store_true",
                       help="the server on CPU 0, the load generator on CPU 1")  # fmt: skip
    parse.add_argument("--rss-growth", type=float, default=0.05)
    parse.add_argument("--p99-ratio", type=float, default=1.5)
    parse.add_argument("--p99-floor", type=float, default=0.0, metavar="MS",
                       help="a last p99 below this passes, whatever the ratio")  # fmt: skip
    parse.add_argument("--json", help="write the figures to this file too")
    return parse


def main() -> int:
    args = parser().parse_args()
    if args.pin:
        os.sched_setaffinity(0, {1})  # the load generator on CPU 1, the server on CPU 0
    try:
        import uvloop  # noqa: PLC0415

        _, result = uvloop.run(soak(args))
    except ImportError:
        _, result = asyncio.run(soak(args))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())

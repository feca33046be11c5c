"""In-memory rate limiting: ratewarden vs `limits` vs a plain-dict floor.

Run from the project root:

    .venv/bin/python bench/bench_memory.py           # full run, a few minutes
    .venv/bin/python bench/bench_memory.py --quick   # smoke run, well under 20 s

What it measures, all in one process and one run:

1. ns per hit, raw (nothing subtracted), for every ratewarden algorithm, the `limits`
   MemoryStorage strategies (the anchor) and a plain-dict counter (the floor), in
   three scenarios: 1 key mostly allowed, 10k keys mostly allowed, 1 key mostly
   denied. Candidates run round-robin in interleaved rounds (the order rotates each
   round) and the table reports the minimum and the median over rounds.
2. Bytes per key of the in-memory state (tracemalloc), beyond the key string.
3. That ``MemoryStore(max_keys=...)`` stays bounded when fed ten times as many keys.

Every candidate is called through the same loop: a ``for`` over a pre-built list of
key strings calling a bound function (``f(k)``; ``f(item, k)`` for `limits`, whose
``hit`` takes the limit item as its first argument). The garbage collector stays on
(allocation is part of the cost); ``gc.collect()`` runs before each timed loop, never
inside one. The default SystemClock (wall time) is used throughout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import hashlib
import importlib.metadata
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from limits import parse, storage, strategies

import ratewarden
from ratewarden import Limiter, MemoryStore

ALLOWED_LIMIT = 10**9  # per minute: never reached in a run
DENIED_LIMIT = 100  # per minute: the warm-up fills it, every timed hit is denied
LOG_LIMIT = 1000  # per minute, for the log-based algorithms (see LOG_NOTE)
N_KEYS = 10_000
ONE_KEY = "user:42"
KEYS = [f"user:{i}" for i in range(N_KEYS)]

OURS: list[tuple[str, str, str]] = [  # (label, algorithm, refill)
    ("fixed_window", "fixed_window", "continuous"),
    ("sliding_window_log", "sliding_window_log", "continuous"),
    ("sliding_window_counter", "sliding_window_counter", "continuous"),
    ("token_bucket", "token_bucket", "continuous"),
    ("token_bucket(interval)", "token_bucket", "interval"),
    ("leaky_bucket", "leaky_bucket", "continuous"),
    ("gcra", "gcra", "continuous"),
]
THEIRS: dict[str, Any] = {
    "limits fixed_window": strategies.FixedWindowRateLimiter,
    "limits moving_window": strategies.MovingWindowRateLimiter,
    "limits sliding_window_counter": strategies.SlidingWindowCounterRateLimiter,
}
FLOOR = "floor (plain dict)"
LOG_BASED = {"sliding_window_log", "limits moving_window"}
# The targets: ours vs the floor and vs limits, for these three algorithms.
VERSUS = {
    "fixed_window": "limits fixed_window",
    "sliding_window_counter": "limits sliding_window_counter",
    "token_bucket": "limits fixed_window",  # limits has no token bucket
    "sliding_window_log": "limits moving_window",  # not a target, shown for reference
}
TARGETS = ("fixed_window", "sliding_window_counter", "token_bucket")
TARGET_FLOOR_RATIO = 3.0
TARGET_SPEEDUP = 5.0
TARGET_BYTES = 150

S_ONE, S_MANY, S_DENIED = "1 key, allowed", "10k keys, allowed", "1 key, denied"
SCENARIOS = (S_ONE, S_MANY, S_DENIED)

LOG_NOTE = f"""\
Log-based candidates (ratewarden sliding_window_log, limits moving_window) keep one
entry per admitted hit in the window, so their cost per hit grows with the number of
admitted hits and a limit of 10**9 would make the log grow without bound during the
run (ours copies its tuple on each hit: O(n); limits inserts Entry objects at the
front of a list: O(n) memmove, and its expiry thread re-slices the list every 10 ms).
Both therefore use the same limit, {LOG_LIMIT}/minute, in the "allowed" scenarios:
  - 1 key: batches of {LOG_LIMIT} hits, each on a key reset before the batch
    (untimed), so every hit is allowed and sees a log of 0..{LOG_LIMIT - 1} entries
    (mean ~{LOG_LIMIT // 2});
  - 10k keys: one warm-up hit per key, then the timed passes; each key's log stays
    at a few entries (1 + passes).
  - "denied" uses {DENIED_LIMIT}/minute like everyone else (log of {DENIED_LIMIT} entries).
Their "x floor" compares against the same plain-dict floor as everyone."""


# --------------------------------------------------------------------------- timing


def run1(f: Callable[[str], object], keys: list[str]) -> int:
    t0 = time.perf_counter_ns()
    for k in keys:
        f(k)
    return time.perf_counter_ns() - t0


def run2(f: Callable[[Any, str], object], item: object, keys: list[str]) -> int:
    t0 = time.perf_counter_ns()
    for k in keys:
        f(item, k)
    return time.perf_counter_ns() - t0


@dataclass
class Case:
    """One candidate in one scenario. ``setup()`` builds a fresh, warmed-up limiter
    (untimed) and returns ``(timed, teardown)``; ``timed()`` runs one batch and
    returns the elapsed ns."""

    name: str
    scenario: str
    limit_desc: str
    setup: Callable[[], tuple[Callable[[], int], Callable[[], None]]]
    batches: int
    hits_per_batch: int
    samples: list[float] = field(default_factory=list)

    def measure(self) -> None:
        gc.collect()
        total = 0
        for _ in range(self.batches):
            timed, teardown = self.setup()
            total += timed()
            teardown()
        self.samples.append(total / (self.batches * self.hits_per_batch))

    @property
    def best(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def _noop() -> None:
    pass


def scenario_plan(name: str, scenario: str, hits: int) -> tuple[int, list[str], list[str], int]:
    """(limit, warm-up keys, timed keys, batches) for a candidate in a scenario."""
    if scenario == S_DENIED:
        return DENIED_LIMIT, [ONE_KEY] * DENIED_LIMIT, [ONE_KEY] * hits, 1
    log = name in LOG_BASED
    limit = LOG_LIMIT if log else ALLOWED_LIMIT
    if scenario == S_MANY:
        return limit, KEYS, KEYS * max(1, hits // N_KEYS), 1
    if log:  # a fresh store per batch: all allowed, log of 0..LOG_LIMIT-1 entries
        return limit, [], [ONE_KEY] * LOG_LIMIT, max(1, hits // LOG_LIMIT)
    return limit, [ONE_KEY], [ONE_KEY] * hits, 1


def ours_case(label: str, algorithm: str, refill: str, scenario: str, hits: int) -> Case:
    limit, warm, keys, batches = scenario_plan(label, scenario, hits)

    def setup() -> tuple[Callable[[], int], Callable[[], None]]:
        lim = Limiter(f"{limit}/minute", algorithm=algorithm, refill=refill, store=MemoryStore())
        f = lim.hit
        for k in warm:
            f(k)
        return (lambda: run1(f, keys)), _noop

    return Case(label, scenario, f"{limit}/min", setup, batches, len(keys))


def limits_case(label: str, strategy: Any, scenario: str, hits: int) -> Case:
    limit, warm, keys, batches = scenario_plan(label, scenario, hits)
    item = parse(f"{limit}/minute")

    def setup() -> tuple[Callable[[], int], Callable[[], None]]:
        st = storage.MemoryStorage()
        f = strategy(st).hit
        for k in warm:
            f(item, k)

        def teardown() -> None:
            # Stop its expiry thread so that it cannot run during another candidate.
            st.timer.cancel()
            st.timer.join()

        return (lambda: run2(f, item, keys)), teardown

    return Case(label, scenario, f"{limit}/min", setup, batches, len(keys))


def floor_case(scenario: str, hits: int) -> Case:
    limit, warm, keys, batches = scenario_plan(FLOOR, scenario, hits)

    def setup() -> tuple[Callable[[], int], Callable[[], None]]:
        d: dict[str, int] = {}

        def floor_hit(key: str) -> bool:
            v = d.get(key, 0) + 1
            d[key] = v
            return v <= limit

        for k in warm:
            floor_hit(k)
        return (lambda: run1(floor_hit, keys)), _noop

    return Case(FLOOR, scenario, f"{limit}/min", setup, batches, len(keys))


def speed(rounds: int, hits: int) -> dict[tuple[str, str], Case]:
    cases: list[Case] = []
    for scenario in SCENARIOS:
        cases.extend(ours_case(*spec, scenario, hits) for spec in OURS)
        cases.extend(limits_case(name, s, scenario, hits) for name, s in THEIRS.items())
        cases.append(floor_case(scenario, hits))
    n = len(cases)
    step = max(1, n // rounds)
    t0 = time.perf_counter()
    for r in range(rounds):
        shift = (r * step) % n
        for case in cases[shift:] + cases[:shift]:
            case.measure()
        print(f"  round {r + 1}/{rounds} done, {time.perf_counter() - t0:.0f} s", flush=True)
    return {(c.name, c.scenario): c for c in cases}


def print_speed(results: dict[tuple[str, str], Case], rounds: int) -> list[str]:
    """Print the table; return the target verdict lines."""
    head = (
        f"{'candidate':<30} {'limit':>12} {'min ns/hit':>11} {'median':>9} {'x floor':>8}"
        f"  vs limits"
    )
    print(
        f"\nns per hit: min and median over {rounds} interleaved rounds (raw, nothing subtracted)"
    )
    for scenario in SCENARIOS:
        floor = results[FLOOR, scenario].best
        print(f"\n== {scenario}")
        print(head)
        print("-" * len(head) + "-" * 30)
        names = [o[0] for o in OURS] + list(THEIRS) + [FLOOR]
        for name in names:
            c = results[name, scenario]
            versus = ""
            if name in VERSUS:
                other = results[VERSUS[name], scenario]
                note = "" if name in TARGETS else ", info only"
                if name == "token_bucket":
                    note = ", limits has no token bucket"
                versus = f"{other.best / c.best:5.2f}x faster than {other.name}{note}"
            print(
                f"{name:<30} {c.limit_desc:>12} {c.best:11.0f} {c.median:9.0f}"
                f" {c.best / floor:8.2f}  {versus}"
            )
    verdicts = []
    for name in TARGETS:
        for scenario in SCENARIOS:
            c = results[name, scenario]
            ratio = c.best / results[FLOOR, scenario].best
            sp = results[VERSUS[name], scenario].best / c.best
            ok_floor = "met" if ratio <= TARGET_FLOOR_RATIO else "MISSED"
            ok_sp = "met" if sp >= TARGET_SPEEDUP else "MISSED"
            verdicts.append(
                f"{name:<24} {scenario:<18} {ratio:5.2f}x floor (<= {TARGET_FLOOR_RATIO:g}: "
                f"{ok_floor:6})  {sp:5.2f}x faster than {VERSUS[name]} "
                f"(>= {TARGET_SPEEDUP:g}: {ok_sp})"
            )
    return verdicts


# --------------------------------------------------------------------------- memory


def _fresh_window(period: int) -> None:
    """Avoid straddling an epoch-aligned window edge (``period`` seconds): states of an
    ended window count as expired and a sweep may drop them, hiding their memory."""
    left = period - time.time() % period
    if left < 3:
        time.sleep(left + 0.05)


def traced(fn: Callable[[], None]) -> tuple[int, int]:
    """(current, peak) traced bytes allocated by ``fn`` and still alive after it."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    fn()
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    return current - before, peak - before


def object_bytes(objs: Iterable[object]) -> int:
    """Bytes of ``objs`` and of the items of the tuples among them, each object once;
    CPython's cached small ints (-5..256) cost nothing per key and are left out."""
    seen: set[int] = set()
    total = 0
    for value in objs:
        for obj in (value, *value) if type(value) is tuple else (value,):
            if id(obj) not in seen and not (type(obj) is int and -5 <= obj <= 256):
                seen.add(id(obj))
                total += sys.getsizeof(obj)
    return total


@dataclass
class MemRow:
    name: str
    variant: str
    n: int
    stored: int  # keys in the store at the end: should be n
    total: int  # traced bytes
    key_bytes: int  # the stored key strings
    values: int  # the states (ours) / counters, expiry floats and RLocks (limits)
    tables: int  # sys.getsizeof of the store's dict(s)

    @property
    def beyond(self) -> float:
        return (self.total - self.key_bytes) / self.n


# Per hour, not per minute: a bucket key hit once at 100/minute is full again (the
# same as no state, so the store may sweep it) 0.6 s later, within the traced run.
MEM_PERIOD = "hour"


def mem_ours(label: str, algorithm: str, refill: str, keys: list[str], cost: int) -> MemRow:
    limit = 100 if cost == 1 else 1000
    for _ in range(3):
        _fresh_window(3600)
        store = MemoryStore()
        lim = Limiter(f"{limit}/{MEM_PERIOD}", algorithm=algorithm, refill=refill, store=store)
        f = lim.hit

        def fill(f: Callable[[str, int], object] = f) -> None:
            for k in keys:
                f(k, cost)

        total, _ = traced(fill)
        if len(store) == len(keys):
            break
    (data,) = store._tables.values()  # one limit: one table, key -> state
    callers = {id(k) for k in keys}
    return MemRow(
        label,
        f"{limit}/{MEM_PERIOD}, cost {cost}",
        len(keys),
        len(data),
        total,
        # key strings the store allocated itself (none: it keeps the caller's strings)
        sum(sys.getsizeof(k) for k in data if id(k) not in callers),
        object_bytes(data.values()),
        sys.getsizeof(data),
    )


def mem_limits(keys: list[str], cost: int) -> MemRow:
    limit = 100 if cost == 1 else 1000
    item = parse(f"{limit}/{MEM_PERIOD}")
    for _ in range(3):
        _fresh_window(3600)
        st = storage.MemoryStorage()
        f = strategies.FixedWindowRateLimiter(st).hit

        def fill(f: Callable[..., object] = f, st: Any = st) -> None:
            for k in keys:
                f(item, k, cost=cost)
            st.timer.cancel()
            st.timer.join()

        total, _ = traced(fill)
        if len(st.storage) == len(keys):
            break
    dicts = (st.storage, st.expirations, st.locks, st.events)
    return MemRow(
        "limits fixed_window",
        f"{limit}/{MEM_PERIOD}, cost {cost}",
        len(keys),
        len(st.storage),
        total,
        sum(sys.getsizeof(item.key_for(k)) for k in keys),
        sum(object_bytes(d.values()) for d in dicts),
        sum(sys.getsizeof(d) for d in dicts),
    )


def memory(n: int) -> list[MemRow]:
    keys = [f"user:{i}" for i in range(n)]
    rows = [mem_ours(*spec, keys, 1) for spec in OURS]
    rows.append(mem_ours("fixed_window", "fixed_window", "continuous", keys, 300))
    rows.append(
        mem_ours("sliding_window_counter", "sliding_window_counter", "continuous", keys, 300)
    )
    rows.append(mem_limits(keys, 1))
    rows.append(mem_limits(keys, 300))
    return rows


def print_memory(rows: list[MemRow], n: int) -> list[str]:
    print(f"\nmemory per key: {n:,} distinct keys, each hit once, tracemalloc, after gc.collect()")
    print(f"  limit 100/{MEM_PERIOD} with cost 1, or 1000/{MEM_PERIOD} with one hit of cost 300")
    print("  (a count above 256 is an int CPython does not cache). Per key:")
    print("  total      = traced bytes still allocated after the hits / keys")
    print("  key str    = sys.getsizeof of key strings the store allocated (ours keeps the")
    print("               caller's own strings: 0; limits builds one per key)")
    print("  beyond key = total - key str  (the figure the target is about)")
    print("  values     = state tuples + their ints (ours); counters, expiry floats, RLocks")
    print("               (limits: Counter + expirations dict + per-key locks dict)")
    print("  dict table = sys.getsizeof of the store's dict(s)")
    print("  rest       = beyond - values - table: what the allocator got beyond getsizeof, e.g.")
    print("               an int made by addition keeps a spare digit (40 bytes, not 36)")
    head = (
        f"{'candidate':<24} {'variant':<19} {'stored':>7} {'total':>6} {'key str':>7}"
        f" {'beyond key':>10} {'values':>6} {'dict table':>10} {'rest':>5}"
    )
    print(head)
    print("-" * len(head))
    verdicts = []
    for r in rows:
        rest = r.beyond - (r.values + r.tables) / r.n
        print(
            f"{r.name:<24} {r.variant:<19} {r.stored:7} {r.total / r.n:6.1f}"
            f" {r.key_bytes / r.n:7.1f} {r.beyond:10.1f} {r.values / r.n:6.1f}"
            f" {r.tables / r.n:10.1f} {rest:5.1f}"
            + ("" if r.stored == r.n else "  <- keys were dropped: figure not valid")
        )
        if r.name in ("fixed_window", "sliding_window_counter"):
            ok = "met" if r.beyond <= TARGET_BYTES else "MISSED"
            verdicts.append(
                f"{r.name:<24} {r.variant:<19} {r.beyond:6.1f} bytes/key beyond the key"
                f" (<= {TARGET_BYTES}: {ok})"
            )
    return verdicts


def bounded(n_keys: int, max_keys: int, ref: MemRow) -> list[str]:
    keys = [f"user:{i}" for i in range(n_keys)]
    print(
        f"\nboundedness: MemoryStore(max_keys={max_keys:,}), fixed_window 100/minute,"
        f" {n_keys:,} distinct keys hit once each"
    )
    tracemalloc.stop()
    _fresh_window(60)
    store = MemoryStore(max_keys=max_keys)
    f = Limiter("100/minute", algorithm="fixed_window", store=store).hit
    gc.collect()
    elapsed = run1(f, keys)
    print(
        f"  untraced run: {elapsed / 1e9:.2f} s, {elapsed / n_keys:.0f} ns/hit (every hit a new"
        f" key, with LRU eviction); len(store) = {len(store):,}, evicted = {store.evicted:,}"
    )
    del f, store
    tracemalloc.start()
    _fresh_window(60)
    store = MemoryStore(max_keys=max_keys)
    f = Limiter("100/minute", algorithm="fixed_window", store=store).hit

    def fill() -> None:
        for k in keys:
            f(k)

    t0 = time.perf_counter()
    current, peak = traced(fill)
    elapsed_traced = time.perf_counter() - t0
    table = sum(sys.getsizeof(t) for t in store._tables.values())
    ratio = current / ref.total
    ratio_no_table = (current - table) / (ref.total - ref.tables)
    print(
        f"  traced run ({elapsed_traced:.1f} s under tracemalloc): len(store) = {len(store):,};"
        f" current = {current / 1e6:.2f} MB (dict table {table / 1e6:.2f} MB),"
        f" peak = {peak / 1e6:.2f} MB"
    )
    print(
        f"  unbounded store, {ref.n:,} keys (memory table, {ref.variant}):"
        f" {ref.total / 1e6:.2f} MB (dict table {ref.tables / 1e6:.2f} MB)"
    )
    print(
        f"  ratio bounded / unbounded: {ratio:.3f} in all, {ratio_no_table:.3f} without the"
        " dict tables (churn leaves the bounded dict one size step larger)"
    )
    return [
        f"bounded store: len = {len(store):,} (<= {max_keys:,}) after {n_keys:,} keys;"
        f" memory {ratio:.3f}x the {ref.n:,}-key unbounded store"
        f" ({ratio_no_table:.3f}x without the dict tables)"
    ]


# --------------------------------------------------------------------------- main


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def src_digest() -> str:
    """A digest of the package's sources, to tie these figures to one code version."""
    root = Path(ratewarden.__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def header(args: argparse.Namespace, rounds: int, hits: int) -> None:
    print("ratewarden memory-store benchmark" + (" (--quick)" if args.quick else ""))
    print(f"date:       {dt.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"python:     {sys.version.split()[0]} ({platform.python_implementation()})")
    print(f"platform:   {platform.platform()}")
    print(f"cpu:        {cpu_model()} x {os.cpu_count()}")
    versions = ", ".join(
        f"{p} {importlib.metadata.version(p)}" for p in ("ratewarden", "limits", "msgspec")
    )
    print(f"packages:   {versions}")
    print(f"src:        sha256 {src_digest()} of src/ratewarden/**/*.py (the code measured)")
    print("gc:         enabled during timing; gc.collect() before each timed loop")
    print(
        f"rounds:     {rounds}, ~{hits:,} timed hits per candidate per round;"
        f" 10k keys = {N_KEYS:,} keys 'user:0'..'user:{N_KEYS - 1}' cycled"
    )
    print(
        f"limits:     allowed = {ALLOWED_LIMIT}/minute (never reached),"
        f" denied = {DENIED_LIMIT}/minute (filled before timing)"
    )
    print(LOG_NOTE)
    print(
        "The limits MemoryStorage runs an expiry thread (every 10 ms while hits come in);"
        " it runs during its own timed loops (a real cost of that store) and is stopped"
        " before any other candidate runs."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: few rounds, few hits")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 9, quick 3)")
    ap.add_argument("--hits", type=int, help="timed hits per candidate per round")
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 9)
    hits = args.hits or (10_000 if args.quick else 60_000)
    mem_n = 10_000 if args.quick else 100_000
    bound_n, bound_max = (100_000, 10_000) if args.quick else (1_000_000, 100_000)

    t_start = time.perf_counter()
    header(args, rounds, hits)
    print("\nspeed:", flush=True)
    results = speed(rounds, hits)
    verdicts = print_speed(results, rounds)

    tracemalloc.start()
    rows = memory(mem_n)
    verdicts += print_memory(rows, mem_n)
    ref = next(r for r in rows if r.name == "fixed_window" and r.variant.endswith("cost 1"))
    verdicts += bounded(bound_n, bound_max, ref)
    tracemalloc.stop()

    print("\ntargets:")
    for v in verdicts:
        print("  " + v)
    print(f"\ntotal time: {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()

"""What every fault test does: load on a store, a fault, recovery, and the checks.

One run of `run_fault` (threads on a `RedisStore`) or `arun_fault` (tasks on an
`AsyncRedisStore`):

1. warm up on a healthy store and take the resources in use (`Usage`);
2. start the fault and keep the load on for `FAULT_SECONDS`: two limiters on the
   same store, one ``fail_open``, one ``fail_closed``, hit by every worker in turn
   on one key;
3. heal it and keep the load on until Redis decides again, then a little longer;
4. check that a fresh key admits exactly its limit, and take the resources again.

`Report.check` then asserts what the fault suite promises (see tests/faults/
__init__.py) and `Report.line` prints the figures. Each decision is timed from
the call to its answer; the breaker's openings and closings are timed by
wrapping its ``failed`` and ``succeeded``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import os
import threading
import time
import tracemalloc
import uuid
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ratewarden import AsyncLimiter, Decision, Limiter
from ratewarden.stores.failure import Breaker

TIMEOUT = 0.05  # the store's timeout in these tests: the production default
# Slack on top of the timeout for one decision: on a shared machine a
# thread can wait for the GIL (5 ms switch interval), a GC pass or a stall of the
# machine itself; more than a slow decision needs, far less than a second timeout.
SLACK = 0.15
FAULT_SECONDS = 0.6
WARM_SECONDS = 0.25  # load before the fault, and after Redis decides again
LIMIT = 1_000_000  # per year: the counted keys never run out (one token per 31.5 s)
EXACT = 20  # the fresh key after recovery: this many of EXACT + 10 pass
# fresh keys tried, the breaker closed again before each: a stall of the machine
# can time a check out (see Stalls); a store that does not count exactly again
# fails every try
EXACT_TRIES = 3
RECLOSE_SECONDS = 5.0  # between tries, the breaker closes again within this
MEMORY_BOUND = 64 * 1024  # bytes more held after the fault than before, the samples aside
OBJECTS_BOUND = 150  # more objects after the fault than before (a new limiter, caches)


@dataclass(slots=True)
class Sample:
    start: float  # time.monotonic() at the call
    latency: float
    policy: str  # the limiter's on_failure
    allowed: bool
    degraded: bool
    # remaining where this limiter's can be (see LIMITS): a reply read for another
    # call would show here (kept as a bool: the int itself, from the reply parser,
    # would count as memory the store holds)
    sane: bool


@dataclass
class Usage:
    """What the client holds at one moment."""

    proxy: int | None  # connections open through the fault proxy
    redis: int | None  # clients connected to Redis (without the one asking)
    conns: dict[int, int]  # this process's TCP connections, by the port they go to
    fds: int
    tasks: int | None  # asyncio tasks of the test's loop
    memory: int | None  # bytes traced (allocated since tracing began) and held, ours aside
    held_by: str  # the lines holding most of them (see traced_memory)
    objects: int  # objects the garbage collector tracks, the samples excluded
    rss: int  # bytes

    def text(self) -> str:
        conns = "+".join(str(n) for _, n in sorted(self.conns.items())) or "0"
        parts = [f"conns {conns}", f"fds {self.fds}", f"objects {self.objects}",
                 f"RSS {self.rss / 2**20:.1f} MiB"]  # fmt: skip
        if self.redis is not None:
            parts.insert(0, f"redis clients {self.redis}")
        if self.proxy is not None:
            parts.insert(0, f"proxy conns {self.proxy}")
        if self.tasks is not None:
            parts.append(f"tasks {self.tasks}")
        return ", ".join(parts)


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def tcp_connections(ports: set[int]) -> dict[int, int]:
    """This process's established TCP connections to ``ports`` on loopback, by port:
    the sockets among its descriptors, looked up in the kernel's table."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since listed
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    counts: dict[int, int] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and fields[9] in inodes and port in ports:  # 01: established
                counts[port] = counts.get(port, 0) + 1
    return counts


_OURS = (__file__, tracemalloc.__file__)


def traced_memory() -> tuple[int, str]:
    """Bytes held now that were allocated since tracing began, except by this
    module (the samples) and by tracemalloc itself; and the lines that hold the
    most of them, one string (``size file:line`` a line: no objects the count of
    objects would see), so that a check that finds memory grown names where."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, name) for name in _OURS]
    )
    lines = snapshot.statistics("lineno")
    where = "\n".join(f"{s.size} {s.traceback[0]}" for s in lines[:HELD_LINES])
    return sum(stat.size for stat in lines), where


HELD_LINES = 40  # the lines a usage keeps, by bytes held


def grown_lines(before: str, after: str, top: int = 5) -> str:
    """The lines of `traced_memory` whose bytes grew most from ``before`` to ``after``."""

    def parse(text: str) -> dict[str, int]:
        return {line: int(size) for size, line in (row.split(" ", 1) for row in text.splitlines())}

    was, now = parse(before), parse(after)
    grown = sorted(((size - was.get(line, 0), line) for line, size in now.items()), reverse=True)
    return "; ".join(f"{line} +{size} B" for size, line in grown[:top] if size > 0)


@dataclass
class BreakerLog:
    """When the breaker opened and closed: ``failed`` and ``succeeded`` wrapped."""

    breaker: Breaker
    opened: list[float] = field(default_factory=list)
    closed: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        breaker, failed, succeeded = self.breaker, self.breaker.failed, self.breaker.succeeded

        def on_failed() -> None:
            was_open = breaker.failures >= breaker.threshold
            failed()
            if not was_open and breaker.failures >= breaker.threshold:
                self.opened.append(time.monotonic())

        def on_succeeded() -> None:
            was_open = breaker.failures >= breaker.threshold
            succeeded()
            if was_open:
                self.closed.append(time.monotonic())

        breaker.failed = on_failed  # type: ignore[method-assign]
        breaker.succeeded = on_succeeded  # type: ignore[method-assign]


def _ms(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds * 1000:.0f} ms"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] if ordered else 0.0


class Stalls:
    """Times when this process did not run: a thread that sleeps `TICK` at a
    time notes each wake-up later than `STALL`. A shared virtual machine freezes
    every core now and then (bench/bench_service.py measures 40-110 ms gaps with
    nothing else running), and a decision in flight then can time out whatever the store
    does; the checks of healthy phases excuse decisions that overlap a stall,
    and the report counts them.

    The same thread adds up how long the servers' processes (``servers()``: Redis,
    the fault proxy) waited for a core while runnable, from the kernel's
    /proc/PID/schedstat. On a busy machine a healthy server can sit that long
    on a run queue and a check times out at its 50 ms for no fault of the store:
    a decision in flight while they waited `STARVED` or more is not held against
    the store's health (`starved`); the time bound, kept by the client alone, is
    never excused by it."""

    TICK = 0.005
    STALL = 0.03
    STARVED = 0.01

    def __init__(self, servers: Callable[[], Iterable[int]] = tuple) -> None:
        self.gaps: list[tuple[float, float]] = []
        self._servers = servers
        # when, and the seconds the servers had waited for a core by then (arrays:
        # no objects for the leak checks' count of objects)
        self._times = array("d")
        self._waited = array("d")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        last = time.monotonic()
        seen: dict[int, int] = {}  # by pid: its run-queue wait in ns, as last read
        waited = 0
        while not self._stop.wait(self.TICK):
            now = time.monotonic()
            if now - last > self.STALL:
                self.gaps.append((last, now))
            last = now
            for pid in self._servers():
                wait = _run_queue_wait(pid)
                if wait is not None:  # a restarted server starts again from 0
                    waited += max(0, wait - seen.get(pid, wait))
                    seen[pid] = wait
            self._times.append(now)
            self._waited.append(waited / 1e9)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def excuse(self, sample: Sample) -> bool:
        """Whether ``sample`` was in flight during a stall."""
        end = sample.start + sample.latency
        return any(a <= end and sample.start <= b for a, b in self.gaps)

    def starved(self, sample: Sample) -> bool:
        """Whether the servers waited `STARVED` or more for a core while ``sample``
        was in flight (from the last look before it to the first after it)."""
        first = max(0, bisect.bisect_right(self._times, sample.start) - 1)
        last = min(
            len(self._times) - 1, bisect.bisect_left(self._times, sample.start + sample.latency)
        )
        return last > first and self._waited[last] - self._waited[first] >= self.STARVED


def _run_queue_wait(pid: int) -> int | None:
    """Nanoseconds ``pid``'s main thread has waited for a core while runnable, or
    None when it is gone (the second of /proc/PID/schedstat's three numbers)."""
    try:
        fd = os.open(f"/proc/{pid}/schedstat", os.O_RDONLY)
    except OSError:
        return None
    try:
        return int(os.read(fd, 128).split()[1])
    except (OSError, IndexError, ValueError):
        return None
    finally:
        os.close(fd)


# Ends the fault, or waits for it to end (a failover); returns when it surely is over,
# and may return the moment until which it surely was not (else: when it was called).
Heal = Callable[[], float | None]


@dataclass
class Report:
    store: str
    fault: str
    began: float = 0.0
    injected: float = 0.0  # inject() returned: the fault is surely on
    lasted: float = 0.0  # the fault surely lasted until then
    healed: float = 0.0  # heal() returned: the fault is surely over
    during: list[Sample] = field(default_factory=list)
    after: list[Sample] = field(default_factory=list)
    breaker: BreakerLog | None = None
    stalls: Stalls | None = None
    before: Usage | None = None
    final: Usage | None = None
    warm: list[Sample] = field(default_factory=list)
    counted: dict[str, int] = field(default_factory=dict)  # by policy: Redis's count
    exact: tuple[int, int] = (0, 0)  # the fresh key: admitted, degraded
    exact_tries: int = 0
    keys_lost: bool = False  # the fault wiped Redis (a restart without persistence)
    expect_degraded: bool = True  # the fault stops every check (not a migration)
    key: str = "counted"  # the key both limiters hit (a hash tag puts it on a cluster node)
    hold: float = FAULT_SECONDS  # from inject() returning to heal() being called
    # admissions beyond Redis's count that the fault may cause (a failover loses
    # what replication had not carried yet); one token may refill meanwhile, per key
    max_over: int = 0
    # tracemalloc makes every allocation slower: fine on the single-server stores'
    # light paths, but it triples the cost of a cluster client's topology refresh
    # and so the decisions it measures; objects are counted either way
    trace_memory: bool = True
    # connections per node a client may hold beyond the most it held before: a
    # cluster client asks for the map with one while another carries a pipeline
    spare_conns: int = 0
    objects_bound: int = OBJECTS_BOUND  # a cluster client's new map holds new node objects

    def admitted(self, policy: str) -> int:
        """Decisions Redis made to admit, on the counted key of ``policy``'s limiter
        (after the wipe, when the fault wiped the keys)."""
        since = self.injected if self.keys_lost else 0.0
        return sum(
            s.allowed and not s.degraded and s.start >= since
            for s in self.warm + self.during + self.after
            if s.policy == policy
        )

    def over_admitted(self) -> int:
        """Admissions the client saw beyond what Redis counted, both limiters."""
        return sum(self.admitted(p) - self.counted[p] for p in self.counted)

    def lost(self) -> int:
        """Counted by Redis, never seen by the client (answers that timed out)."""
        return sum(self.counted[p] - self.admitted(p) for p in self.counted)

    def breaker_times(self) -> tuple[float | None, float | None]:
        """Seconds from the fault's start to the breaker's first opening, and from
        when the fault surely still lasted to its first closing after."""
        assert self.breaker is not None
        opened = [t - self.began for t in self.breaker.opened if t >= self.began]
        closed = [t - self.lasted for t in self.breaker.closed if t >= self.lasted]
        return (opened[0] if opened else None), (closed[0] if closed else None)

    def line(self) -> str:
        latencies = [s.latency for s in self.during]
        opened, closed = self.breaker_times()
        assert self.before is not None
        assert self.final is not None
        degraded = [s for s in self.during if s.degraded]
        return (
            f"FAULT {self.store}/{self.fault}: {len(self.during)} decisions during the fault,"
            f" p99 {percentile(latencies, 0.99) * 1000:.1f} ms, max"
            f" {max(latencies, default=0) * 1000:.1f} ms (after: max"
            f" {max((s.latency for s in self.after), default=0) * 1000:.1f} ms);"
            f" degraded {len(degraded)}: fail_open allowed"
            f" {sum(s.allowed for s in degraded if s.policy == 'fail_open')}/"
            f"{sum(s.policy == 'fail_open' for s in degraded)}, fail_closed denied"
            f" {sum(not s.allowed for s in degraded if s.policy == 'fail_closed')}/"
            f"{sum(s.policy == 'fail_closed' for s in degraded)}; breaker opened"
            f" {_ms(opened)} into the fault, closed {_ms(closed)} after it ended;"
            f" before: {self.before.text()}; after: {self.final.text()};"
            f" memory {self._memory()}; over-admitted {self.over_admitted()},"
            f" lost {self.lost()}; fresh key {self.exact[0]}/{EXACT} admitted"
            f" ({self.exact_tries} tries); {len(self.excused())} decisions excused in"
            f" {len(self.stalls.gaps) if self.stalls else 0} stalls of the machine"
        )

    def excused(self) -> list[Sample]:
        """Decisions of healthy phases that were degraded or slow, but in flight
        while the machine stalled (see `Stalls`)."""
        assert self.stalls is not None
        bound = TIMEOUT + SLACK
        healthy = [s for s in self.warm + self.during + self.after if s.degraded] if (
            not self.expect_degraded) else [s for s in self.warm if s.degraded]  # fmt: skip
        slow = [s for s in self.during + self.after if s.latency > bound]
        stalls = self.stalls
        return [s for s in healthy if stalls.excuse(s) or stalls.starved(s)] + [
            s for s in slow if stalls.excuse(s)
        ]

    def _memory(self) -> str:
        assert self.before is not None
        assert self.final is not None
        if self.before.memory is None or self.final.memory is None:
            return "not traced"
        return f"{(self.final.memory - self.before.memory) / 1024:+.0f} KiB"

    def check(self) -> None:
        """The suite's promises for one fault (see tests/faults/__init__.py)."""
        self._check_decisions()
        self._check_recovery()
        self._check_leaks()

    def _check_decisions(self) -> None:
        """Time bound, policies, and the fault's effect while it lasts."""
        assert self.during, "no decisions during the fault"
        assert self.stalls is not None
        excuse = self.stalls.excuse
        bound = TIMEOUT + SLACK
        slow = [s for s in self.during + self.after if s.latency > bound and not excuse(s)]
        assert not slow, f"{len(slow)} decisions took longer than {bound}s: {slow[:3]}"
        starved = self.stalls.starved  # a healthy server kept off the cores: see Stalls
        warm = [s for s in self.warm if s.degraded and not excuse(s) and not starved(s)]
        assert not warm, f"degraded before the fault: {warm[:3]}"
        # the policy answers, and nothing but the policy while the fault lasts
        for s in self.during + self.after:
            if s.degraded:
                assert s.allowed == (s.policy == "fail_open"), s
            else:
                assert s.sane, s  # a reply meant for another call?
        if self.expect_degraded:
            # from once the fault has surely set in to before it ended
            settled = [
                s
                for s in self.during
                if s.start > self.began + bound and s.start + s.latency < self.lasted
            ]
            assert settled, "no decisions once the fault had set in"
            decided = [s for s in settled if not s.degraded]
            assert not decided, f"Redis decided during the fault: {decided[:3]}, {self.began=}"
            opened, closed = self.breaker_times()
            assert opened is not None, "the breaker never opened"
            assert opened <= 3 * bound, f"the breaker opened only {opened:.3f}s into the fault"
            assert closed is not None, "the breaker never closed after the fault"
            assert closed <= 1.0, f"the breaker closed only {closed:.3f}s after the fault"
        else:
            degraded = [
                s for s in self.during + self.after if s.degraded and not (excuse(s) or starved(s))
            ]
            assert not degraded, f"degraded decisions: {degraded[:3]}"

    def _check_recovery(self) -> None:
        """Exact again, the breaker closed, nothing admitted beyond Redis's count."""
        assert self.exact == (EXACT, 0), f"fresh key after recovery: {self.exact}"
        assert self.breaker is not None
        breaker = self.breaker.breaker
        assert breaker.failures == 0, (
            f"the store still fails after recovery: {breaker!r}, opened at"
            f" {[t - self.began for t in self.breaker.opened]}, closed at"
            f" {[t - self.began for t in self.breaker.closed]}, healed {self.healed - self.began}"
        )
        over = self.over_admitted()
        assert over <= self.max_over + len(self.counted), f"admitted {over} beyond Redis's count"

    def _check_leaks(self) -> None:
        """Nothing leaks: connections, descriptors, tasks, memory."""
        assert self.before is not None
        assert self.final is not None
        if self.before.proxy is not None:
            assert self.final.proxy is not None
            assert self.final.proxy <= self.before.proxy, "connections leaked"
        if self.before.redis is not None:
            assert self.final.redis is not None
            assert self.final.redis <= self.before.redis, "Redis connections leaked"
        # per Redis node, no more connections than any node had before: a cluster
        # client may open some to nodes it had none to (a failover's new master, a
        # replica it asks for the cluster's map), but a leak grows with each failure
        most = max(self.before.conns.values(), default=0)
        assert max(self.final.conns.values(), default=0) <= most + self.spare_conns, (
            f"connections leaked: {self.before.conns} before, {self.final.conns} after"
        )
        # descriptors: no more than before, but for the connections just allowed for
        fds = [u.fds - sum(u.conns.values()) for u in (self.before, self.final)]
        assert fds[1] <= fds[0], "file descriptors leaked"
        assert self.final.tasks == self.before.tasks, "asyncio tasks leaked"
        grown = self.final.objects - self.before.objects
        assert grown < self.objects_bound, f"{grown} more objects after the fault"
        if self.final.memory is not None:
            assert self.before.memory is not None
            grew = self.final.memory - self.before.memory
            assert grew < MEMORY_BOUND, (
                f"{grew} bytes more held after the fault, most by"
                f" {grown_lines(self.before.held_by, self.final.held_by)}"
            )


def name() -> str:
    return f"f{uuid.uuid4().hex[:8]}"


@dataclass
class Target:
    """Where the test looks: the ports the store connects to (Redis's, or the
    proxy's), Redis's own count of its clients (INFO clients; None where it
    counts more than ours, as on a cluster whose MIGRATE keeps connections of its
    own), and the proxy's count of its connections, if there is one."""

    ports: Callable[[], set[int]]
    redis_clients: Callable[[], int] | None = None
    proxy_open: Callable[[], int] | None = None
    servers: Callable[[], Iterable[int]] = tuple  # their processes' ids (see Stalls)


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def usage(target: Target, tasks: int | None) -> Usage:
    gc.collect()
    memory, held_by = traced_memory() if tracemalloc.is_tracing() else (None, "")
    return Usage(
        proxy=None if target.proxy_open is None else target.proxy_open(),
        redis=None if target.redis_clients is None else target.redis_clients(),
        conns=tcp_connections(target.ports()),
        fds=fds(),
        tasks=tasks,
        memory=memory,
        held_by=held_by,
        objects=sum(type(o) is not Sample for o in gc.get_objects()),
        rss=rss(),
    )


def settled_usage(target: Target, tasks: Callable[[], int | None], before: Usage) -> Usage:
    """The usage once closed connections are gone on both ends (Redis and the
    proxy see a close a moment after the client makes it) and in this process (a
    dropped socket's descriptor closes when it is collected): polled up to 2 s,
    for as long as it shows more than ``before``. A leak outlasts that."""
    deadline = time.monotonic() + 2.0
    held = before.fds - sum(before.conns.values())
    while True:
        now = usage(target, tasks())
        more = (now.proxy or 0) > (before.proxy or 0) or (now.redis or 0) > (before.redis or 0)
        more = more or now.fds - sum(now.conns.values()) > held
        if not more or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


# -- the sync store: threads -------------------------------------------------------

THREADS = 4
PACE = 0.001  # each worker's pause between rounds: load, not a busy loop


POLICIES = ("fail_open", "fail_closed")
# Per year, by policy: limits far apart, so that a reply read for the wrong call
# (the other limiter's) shows as a remaining out of this limiter's range, which a
# test's few thousand admissions never leave.
LIMITS = {"fail_open": LIMIT, "fail_closed": LIMIT * 2 // 5}
SPAN = LIMIT // 5


def sane(policy: str, remaining: int) -> bool:
    return LIMITS[policy] - SPAN < remaining <= LIMITS[policy]


def _hit(limiter: Limiter, key: str, policy: str, out: list[Sample]) -> None:
    start = time.monotonic()
    decision = limiter.hit(key)
    latency = time.monotonic() - start
    out.append(Sample(start, latency, policy, decision.allowed, decision.degraded,
                      sane(policy, decision.remaining)))  # fmt: skip


@contextlib.contextmanager
def threads_hitting(limiters: list[Limiter], key: str, out: list[Sample]) -> Iterator[None]:
    """THREADS threads hitting ``key`` of each limiter in turn until the block ends
    (the limiters in the order of POLICIES)."""
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            for limiter, policy in zip(limiters, POLICIES, strict=True):
                _hit(limiter, key, policy, out)
            time.sleep(PACE)

    workers = [threading.Thread(target=work) for _ in range(THREADS)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        stop.set()
        for worker in workers:
            worker.join(10)


def _until_healthy(samples: list[Sample], since: float, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not any(s.start >= since and not s.degraded for s in samples[-64:]):
        if time.monotonic() > deadline:
            raise AssertionError(f"Redis did not decide again within {limit}s of the healing")
        time.sleep(0.01)


def run_fault(
    store: Any,
    report: Report,
    target: Target,
    inject: Callable[[], None],
    heal: Heal,
    *,
    recover: float = 5.0,
) -> Report:
    """One fault on a sync store (see the module docstring)."""
    report.breaker = BreakerLog(store.breaker)
    prefix = name()
    limiters = [
        Limiter(f"{LIMITS[policy]}/year", algorithm="gcra", store=store,
                name=f"{prefix}-{policy}", on_failure=policy)  # type: ignore[arg-type]
        for policy in POLICIES
    ]  # fmt: skip
    report.stalls = Stalls(target.servers)
    if report.trace_memory:  # from before the warm-up: what it allocates, later freed,
        tracemalloc.start()  # counts against what the fault adds
    try:
        with threads_hitting(limiters, report.key, report.warm):
            time.sleep(WARM_SECONDS)
        before = report.before = usage(target, None)
        samples: list[Sample] = []
        with threads_hitting(limiters, report.key, samples):
            report.began = time.monotonic()
            inject()
            report.injected = time.monotonic()
            time.sleep(report.hold)
            healing = time.monotonic()
            report.lasted = heal() or healing
            report.healed = time.monotonic()
            _until_healthy(samples, report.healed, recover)
            time.sleep(WARM_SECONDS)
        report.during = [s for s in samples if s.start < report.healed]
        report.after = [s for s in samples if s.start >= report.healed]
        for limiter, policy in zip(limiters, POLICIES, strict=True):
            report.counted[policy] = LIMITS[policy] - limiter.peek(report.key).remaining
        while report.exact != (EXACT, 0) and report.exact_tries < EXACT_TRIES:
            if report.exact_tries:
                _closed(store, report.key)
            report.exact_tries += 1
            fresh = Limiter(f"{EXACT}/year", algorithm="gcra", store=store, name=name(),
                            on_failure="fail_open")  # fmt: skip
            report.exact = _exact([fresh.hit(report.key) for _ in range(EXACT + 10)])
        report.final = settled_usage(target, lambda: None, before)
    finally:
        tracemalloc.stop()  # a no-op when not tracing
        report.stalls.stop()
    return report


def _closed(store: Any, key: str) -> None:
    """Waits until ``store``'s breaker is closed, probing it with a throwaway limit:
    a try that failed (a stall timed a check out) opened it, and while it is
    open, or while its probe is out, every check of the next try would be
    degraded without reaching Redis, so the tries would not be tries."""
    probe = Limiter(f"{LIMIT}/year", algorithm="gcra", store=store, name=name(),
                    on_failure="fail_open")  # fmt: skip
    deadline = time.monotonic() + RECLOSE_SECONDS
    while store.breaker.failures and time.monotonic() < deadline:
        time.sleep(store.breaker.retry_after() + 0.001)
        probe.hit(key)


async def _aclosed(store: Any, key: str) -> None:
    """`_closed` for an async store."""
    probe = AsyncLimiter(f"{LIMIT}/year", algorithm="gcra", store=store, name=name(),
                         on_failure="fail_open")  # fmt: skip
    deadline = time.monotonic() + RECLOSE_SECONDS
    while store.breaker.failures and time.monotonic() < deadline:
        await asyncio.sleep(store.breaker.retry_after() + 0.001)
        await probe.hit(key)


def _exact(decisions: list[Decision]) -> tuple[int, int]:
    return (sum(d.allowed and not d.degraded for d in decisions),
            sum(d.degraded for d in decisions))  # fmt: skip


# -- the async store: tasks -------------------------------------------------------

TASKS = 16


async def _ahit(limiter: AsyncLimiter, key: str, policy: str, out: list[Sample]) -> None:
    start = time.monotonic()
    decision = await limiter.hit(key)
    latency = time.monotonic() - start
    out.append(Sample(start, latency, policy, decision.allowed, decision.degraded,
                      sane(policy, decision.remaining)))  # fmt: skip


@contextlib.asynccontextmanager
async def tasks_hitting(limiters: list[AsyncLimiter], key: str, out: list[Sample]) -> Any:
    stop = asyncio.Event()

    async def work() -> None:
        while not stop.is_set():
            for limiter, policy in zip(limiters, POLICIES, strict=True):
                await _ahit(limiter, key, policy, out)
            await asyncio.sleep(PACE)

    workers = [asyncio.ensure_future(work()) for _ in range(TASKS)]
    try:
        yield
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await asyncio.gather(*workers)


async def _auntil_healthy(samples: list[Sample], since: float, limit: float) -> None:
    try:
        async with asyncio.timeout(limit):
            while not any(s.start >= since and not s.degraded for s in samples[-64:]):
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"Redis did not decide again within {limit}s of the healing") from None


async def arun_fault(
    store: Any,
    report: Report,
    target: Target,
    inject: Callable[[], None],
    heal: Heal,
    *,
    recover: float = 5.0,
) -> Report:
    """One fault on an async store; ``inject`` and ``heal`` run in a thread, so that
    a blocking one (a server starting) does not stall the loop being measured."""
    report.breaker = BreakerLog(store.breaker)
    prefix = name()
    limiters = [
        AsyncLimiter(f"{LIMITS[policy]}/year", algorithm="gcra", store=store,
                     name=f"{prefix}-{policy}", on_failure=policy)  # type: ignore[arg-type]
        for policy in POLICIES
    ]  # fmt: skip
    report.stalls = Stalls(target.servers)
    if report.trace_memory:  # see run_fault
        tracemalloc.start()
    try:
        async with tasks_hitting(limiters, report.key, report.warm):
            await asyncio.to_thread(time.sleep, WARM_SECONDS)  # the executor's thread exists before
        before = report.before = await asyncio.to_thread(usage, target, len(asyncio.all_tasks()))
        samples: list[Sample] = []
        async with tasks_hitting(limiters, report.key, samples):
            report.began = time.monotonic()
            await asyncio.to_thread(inject)
            report.injected = time.monotonic()
            await asyncio.sleep(report.hold)
            healing = time.monotonic()
            lasted = await asyncio.to_thread(heal)
            report.lasted = lasted or healing
            report.healed = time.monotonic()
            await _auntil_healthy(samples, report.healed, recover)
            await asyncio.sleep(WARM_SECONDS)
        report.during = [s for s in samples if s.start < report.healed]
        report.after = [s for s in samples if s.start >= report.healed]
        for limiter, policy in zip(limiters, POLICIES, strict=True):
            report.counted[policy] = LIMITS[policy] - (await limiter.peek(report.key)).remaining
        while report.exact != (EXACT, 0) and report.exact_tries < EXACT_TRIES:
            if report.exact_tries:
                await _aclosed(store, report.key)
            report.exact_tries += 1
            fresh = AsyncLimiter(f"{EXACT}/year", algorithm="gcra", store=store, name=name(),
                                 on_failure="fail_open")  # fmt: skip
            hits = [fresh.hit(report.key) for _ in range(EXACT + 10)]
            report.exact = _exact(await asyncio.gather(*hits))
        count = len(asyncio.all_tasks())
        report.final = await asyncio.to_thread(settled_usage, target, lambda: count, before)
    finally:
        tracemalloc.stop()  # a no-op when not tracing
        report.stalls.stop()
    return report

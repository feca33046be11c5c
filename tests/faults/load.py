"""What every fault test does: load on a store, a fault, recovery, and the checks.

One run of `run_fault` (threads on a `RedisStore`) or `arun_fault` (tasks on an
`AsyncRedisStore`):

1. warm up on a healthy store and take the resources in use (`Usage`);
2. start the fault and keep the load on for `FAULT_SECONDS`: two limiters on the
   same store, one ``fail_open``, one ``fail_closed``, hit by every worker in turn;
3. heal it and keep the load on until Redis decides again, then a little longer;
4. check that a fresh key admits exactly its limit, and take the resources again.

`Report.check` then asserts what the fault suite promises (see tests/faults/
__init__.py) and `Report.line` prints the figures. Each decision is timed from
the call to its answer; the breaker's openings and closings are timed by
wrapping its ``failed`` and ``succeeded``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ratewarden import AsyncLimiter, Limiter
from ratewarden.stores._failure import Breaker

TIMEOUT = 0.05  # the store's timeout in these tests: the production default
# Slack on top of the timeout for one decision: this is a shared 2-core VM where a
# thread can wait for the GIL (5 ms switch interval), a GC pass or a stall of the
# machine itself; more than a slow decision needs, far less than a second timeout.
SLACK = 0.15
FAULT_SECONDS = 1.0
LIMIT = 1_000_000  # per year: the counted keys never run out (one token per 31.5 s)
EXACT = 20  # the fresh key after recovery: this many of EXACT + 10 pass
MEMORY_BOUND = 64 * 1024  # bytes the store may still hold after the fault, of its own


@dataclass(slots=True)
class Sample:
    start: float  # time.monotonic() at the call
    latency: float
    policy: str  # the limiter's on_failure
    allowed: bool
    degraded: bool
    # remaining within the limit: a reply read for the wrong call would show here
    # (kept as a bool: the int itself, from the reply parser, would count as memory
    # the store holds)
    sane: bool


@dataclass
class Usage:
    """What the client holds at one moment."""

    proxy: int | None  # connections open through the fault proxy
    redis: int  # clients connected to Redis (without the one asking)
    fds: int
    tasks: int | None  # asyncio tasks of the test's loop
    memory: int  # bytes allocated since tracing began and still held, ours excluded

    def text(self) -> str:
        parts = [f"redis clients {self.redis}", f"fds {self.fds}"]
        if self.proxy is not None:
            parts.insert(0, f"proxy conns {self.proxy}")
        if self.tasks is not None:
            parts.append(f"tasks {self.tasks}")
        return ", ".join(parts)


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


_OURS = (__file__, tracemalloc.__file__)


def traced_memory() -> int:
    """Bytes held now that were allocated since tracing began, except by this
    module (the samples) and by tracemalloc itself."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, name) for name in _OURS]
    )
    return sum(stat.size for stat in snapshot.statistics("filename"))


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


@dataclass
class Report:
    store: str
    fault: str
    began: float = 0.0
    healed: float = 0.0
    during: list[Sample] = field(default_factory=list)
    after: list[Sample] = field(default_factory=list)
    breaker: BreakerLog | None = None
    before: Usage | None = None
    final: Usage | None = None
    warm: list[Sample] = field(default_factory=list)
    counted: dict[str, int] = field(default_factory=dict)  # by policy: Redis's count
    exact: tuple[int, int] = (0, 0)  # the fresh key: admitted, degraded
    keys_lost: bool = False  # the fault wiped Redis (a restart without persistence)
    expect_degraded: bool = True  # the fault stops every check (not a slow link)

    def admitted(self, policy: str) -> int:
        """Decisions Redis made to admit, on the counted key of ``policy``'s limiter
        (after the wipe, when the fault wiped the keys)."""
        since = self.began if self.keys_lost else 0.0
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
        the healing to its last closing."""
        assert self.breaker is not None
        opened = [t - self.began for t in self.breaker.opened if t >= self.began]
        closed = [t - self.healed for t in self.breaker.closed if t >= self.healed]
        return (opened[0] if opened else None), (closed[-1] if closed else None)

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
            f" before: {self.before.text()}; after: {self.final.text()}; memory kept"
            f" {self.final.memory / 1024:+.0f} KiB; over-admitted {self.over_admitted()},"
            f" lost {self.lost()}; fresh key {self.exact[0]}/{EXACT} admitted"
        )

    def check(self) -> None:
        """The suite's promises for one fault (see tests/faults/__init__.py)."""
        assert self.during, "no decisions during the fault"
        bound = TIMEOUT + SLACK
        slow = [s for s in self.during + self.after if s.latency > bound]
        assert not slow, f"{len(slow)} decisions took longer than {bound}s: {slow[:3]}"
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
                if s.start > self.began + bound and s.start + s.latency < self.healed
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
            assert not any(s.degraded for s in self.during + self.after)
        assert self.breaker is not None
        assert self.breaker.breaker.failures == 0, "the store still fails after recovery"
        assert not self.after[-1].degraded
        assert self.exact == (EXACT, 0), f"fresh key after recovery: {self.exact}"
        # ``counted`` reads Redis's remaining; one token may refill in the meantime
        assert self.over_admitted() <= len(self.counted), "admitted beyond Redis's count"
        # nothing leaks: connections, descriptors, tasks, memory
        assert self.before is not None
        assert self.final is not None
        if self.before.proxy is not None:
            assert self.final.proxy is not None
            assert self.final.proxy <= self.before.proxy, "connections leaked"
        assert self.final.redis <= self.before.redis, "Redis connections leaked"
        assert self.final.fds <= self.before.fds, "file descriptors leaked"
        assert self.final.tasks == self.before.tasks, "asyncio tasks leaked"
        assert self.final.memory < MEMORY_BOUND, f"{self.final.memory} bytes kept"


def name() -> str:
    return f"f{uuid.uuid4().hex[:8]}"


@dataclass
class Target:
    """Where the test's admin looks: Redis (INFO clients) and the proxy, if any."""

    redis_clients: Callable[[], int]
    proxy_open: Callable[[], int] | None = None


def usage(target: Target, tasks: int | None) -> Usage:
    return Usage(
        proxy=None if target.proxy_open is None else target.proxy_open(),
        redis=target.redis_clients(),
        fds=fds(),
        tasks=tasks,
        memory=traced_memory() if tracemalloc.is_tracing() else 0,
    )


def settled_usage(target: Target, tasks: Callable[[], int | None], before: Usage) -> Usage:
    """The usage once closed connections are gone on both ends (Redis and the
    proxy see a close a moment after the client makes it): polled up to 2 s,
    for as long as it shows more than ``before``."""
    deadline = time.monotonic() + 2.0
    while True:
        now = usage(target, tasks())
        more = (now.proxy or 0) > (before.proxy or 0) or now.redis > before.redis
        if not more or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


# -- the sync store: threads -------------------------------------------------------

THREADS = 4
PACE = 0.001  # each worker's pause between rounds: load, not a busy loop


POLICIES = ("fail_open", "fail_closed")


def _hit(limiter: Limiter, policy: str, out: list[Sample]) -> None:
    start = time.monotonic()
    decision = limiter.hit("counted")
    latency = time.monotonic() - start
    out.append(Sample(start, latency, policy, decision.allowed, decision.degraded,
                      0 <= decision.remaining <= LIMIT))  # fmt: skip


@contextlib.contextmanager
def threads_hitting(limiters: list[Limiter], out: list[Sample]) -> Iterator[None]:
    """THREADS threads hitting each limiter's key "counted" in turn until the block
    ends (the limiters in the order of POLICIES)."""
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            for limiter, policy in zip(limiters, POLICIES, strict=True):
                _hit(limiter, policy, out)
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
    heal: Callable[[], None],
    *,
    recover: float = 5.0,
) -> Report:
    """One fault on a sync store (see the module docstring)."""
    report.breaker = BreakerLog(store.breaker)
    prefix = name()
    limiters = [
        Limiter(f"{LIMIT}/year", algorithm="gcra", store=store, name=f"{prefix}-{policy}",
                on_failure=policy)  # type: ignore[arg-type]
        for policy in POLICIES
    ]  # fmt: skip
    with threads_hitting(limiters, report.warm):
        time.sleep(0.3)
    assert not any(s.degraded for s in report.warm), "degraded before the fault"
    tracemalloc.start()
    try:
        before = report.before = usage(target, None)
        samples: list[Sample] = []
        with threads_hitting(limiters, samples):
            report.began = time.monotonic()
            inject()
            time.sleep(FAULT_SECONDS)
            report.healed = time.monotonic()
            heal()
            _until_healthy(samples, report.healed, recover)
            time.sleep(0.3)
        report.during = [s for s in samples if s.start < report.healed]
        report.after = [s for s in samples if s.start >= report.healed]
        for limiter, policy in zip(limiters, POLICIES, strict=True):
            report.counted[policy] = LIMIT - limiter.peek("counted").remaining
        fresh = Limiter(f"{EXACT}/year", store=store, name=name(), on_failure="fail_open")
        decisions = [fresh.hit("k") for _ in range(EXACT + 10)]
        report.exact = (sum(d.allowed and not d.degraded for d in decisions),
                        sum(d.degraded for d in decisions))  # fmt: skip
        report.final = settled_usage(target, lambda: None, before)
    finally:
        tracemalloc.stop()
    return report


# -- the async store: tasks -------------------------------------------------------

TASKS = 16


async def _ahit(limiter: AsyncLimiter, policy: str, out: list[Sample]) -> None:
    start = time.monotonic()
    decision = await limiter.hit("counted")
    latency = time.monotonic() - start
    out.append(Sample(start, latency, policy, decision.allowed, decision.degraded,
                      0 <= decision.remaining <= LIMIT))  # fmt: skip


@contextlib.asynccontextmanager
async def tasks_hitting(limiters: list[AsyncLimiter], out: list[Sample]) -> Any:
    stop = asyncio.Event()

    async def work() -> None:
        while not stop.is_set():
            for limiter, policy in zip(limiters, POLICIES, strict=True):
                await _ahit(limiter, policy, out)
            await asyncio.sleep(PACE)

    workers = [asyncio.ensure_future(work()) for _ in range(TASKS)]
    try:
        yield
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await asyncio.gather(*workers)


async def _auntil_healthy(samples: list[Sample], since: float, limit: float) -> None:
    async with asyncio.timeout(limit):
        while not any(s.start >= since and not s.degraded for s in samples[-64:]):
            await asyncio.sleep(0.01)


async def arun_fault(
    store: Any,
    report: Report,
    target: Target,
    inject: Callable[[], None],
    heal: Callable[[], None],
    *,
    recover: float = 5.0,
) -> Report:
    """One fault on an async store; ``inject`` and ``heal`` run in a thread, so that
    a blocking one (a server starting) does not stall the loop being measured."""
    report.breaker = BreakerLog(store.breaker)
    prefix = name()
    limiters = [
        AsyncLimiter(f"{LIMIT}/year", algorithm="gcra", store=store, name=f"{prefix}-{policy}",
                     on_failure=policy)  # type: ignore[arg-type]
        for policy in POLICIES
    ]  # fmt: skip
    async with tasks_hitting(limiters, report.warm):
        await asyncio.to_thread(time.sleep, 0.3)  # the executor's thread exists before
    assert not any(s.degraded for s in report.warm), "degraded before the fault"
    tracemalloc.start()
    try:
        before = report.before = await asyncio.to_thread(usage, target, len(asyncio.all_tasks()))
        samples: list[Sample] = []
        async with tasks_hitting(limiters, samples):
            report.began = time.monotonic()
            await asyncio.to_thread(inject)
            await asyncio.sleep(FAULT_SECONDS)
            report.healed = time.monotonic()
            await asyncio.to_thread(heal)
            await _auntil_healthy(samples, report.healed, recover)
            await asyncio.sleep(0.3)
        report.during = [s for s in samples if s.start < report.healed]
        report.after = [s for s in samples if s.start >= report.healed]
        for limiter, policy in zip(limiters, POLICIES, strict=True):
            report.counted[policy] = LIMIT - (await limiter.peek("counted")).remaining
        fresh = AsyncLimiter(f"{EXACT}/year", store=store, name=name(), on_failure="fail_open")
        decisions = await asyncio.gather(*(fresh.hit("k") for _ in range(EXACT + 10)))
        report.exact = (sum(d.allowed and not d.degraded for d in decisions),
                        sum(d.degraded for d in decisions))  # fmt: skip
        count = len(asyncio.all_tasks())
        report.final = await asyncio.to_thread(settled_usage, target, lambda: count, before)
    finally:
        tracemalloc.stop()
    return report

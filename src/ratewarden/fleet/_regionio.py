"""A region's processes: `RegionalLimiter` checks requests exactly on the regional
Redis against the regional limit; `RegionRebalancer` (one per region) moves the
regional limit with the fleet coordinator on the home Redis. See `_regions`.

A limiter polls its regional limit inline, at most every ``poll`` seconds: one
pipelined round trip that also adds its demand since the last poll. A limit
change binds the Redis store's limit anew under the same key prefix, so the
counts carry over: the window under way keeps what it has counted, and is judged
against the new limit from then on (a smaller limit denies until the window has
room under it; a larger one admits up to it).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from ..algorithms import get_algorithm
from ..primitives import Clock, ConfigurationError, Decision, Rate, StoreUnavailable, default_clock
from ..stores.base import Bound
from ..stores.failure import OnFailure, check_policy
from ..stores.redis import RedisStore
from ..stores.redis.connection import FAILURES, connect
from ..stores.redis.scripts import redis_params
from ._line import log
from ._regions import (
    Demand,
    Record,
    RegionSplit,
    limit_at,
    next_limits,
    parse_record,
    record_fields,
    text,
)
from .alloc import MILLI, Piece
from .coordinator import Coordinator, Report
from .member import _TRANSIENT

__all__ = ["RegionRebalancer", "RegionalLimiter"]

GARBAGE_MS = 3_600_000  # the record's TTL on top of two leases: only for cleaning up


class _View:
    """What a limiter knows of its regional limit; no I/O. Times: ``now`` in ns of
    the limiter's clock; the record's in ms of the regional Redis's clock, which
    the last poll related to the limiter's (``offset_ms``)."""

    def __init__(self, split: RegionSplit, region: str) -> None:
        self.split = split
        self.static = split.static[split.check_region(region)]
        self.record: Record | None = None
        self.offset_ms = 0  # regional clock minus the limiter's
        self.asked = 0  # permits asked for since the last poll (denied ones too)
        self.used = 0  # permits admitted since the last poll
        self.poll_at: float = 0 if split.dynamic else math.inf  # ns
        self.due: float = 0  # ns: the next poll or change of the limit by time
        self.limit = self.static
        self.polls = self.failures = 0

    def take_counts(self) -> tuple[int, int]:
        counts = self.asked, self.used
        self.asked = self.used = 0
        return counts

    def on_poll(self, raw: Any, regional_ms: int | None, now: int) -> None:
        self.polls += 1
        self.record = parse_record(raw)
        if regional_ms is not None:
            self.offset_ms = regional_ms - now // 1_000_000
        self.poll_at = now + round(self.split.poll * 1e9)

    def on_failure(self, counts: tuple[int, int], now: int) -> None:
        """The regional Redis did not answer: keep the counts for the next poll and
        the record as it was (its lease still runs out on time)."""
        self.failures += 1
        self.asked += counts[0]
        self.used += counts[1]
        self.poll_at = now + round(self.split.poll * 1e9)

    def evaluate(self, now: int) -> int:
        regional = now // 1_000_000 + self.offset_ms
        self.limit, change = limit_at(self.record, regional, self.static, self.split.window_ms)
        due: float = self.poll_at
        if change is not None:
            due = min(due, (change - self.offset_ms) * 1_000_000)
        self.due = due
        return self.limit


class RegionalLimiter:
    """Limits keys to ``region``'s share of ``split``'s global rate, exactly, on
    the regional Redis behind ``store`` (a `RedisStore`).

    - ``hit(key, cost=1)`` counts the request if it fits the regional limit and
      returns a `Decision` (its ``limit`` is the regional limit);
    - ``peek(key, cost=1)`` what such a hit would be told, counting nothing;
    - ``limit``: the regional limit in force (permits a window).

    A static split applies the region's static share and never polls. A dynamic
    one reads the limit its `RegionRebalancer` writes and records the region's
    demand for it. While the regional limit is 0, every request is denied
    locally. ``clock``: a test clock, read for the record's times instead of the
    regional Redis's TIME (give the store the same one). ``on_failure`` as for a
    `Limiter`; while the regional Redis is unreachable, the limit stays what it
    was, and its lease still runs out on time.
    """

    def __init__(
        self,
        split: RegionSplit,
        region: str,
        store: RedisStore,
        *,
        clock: Clock | None = None,
        on_failure: OnFailure = "raise",
        name: str | None = None,
    ) -> None:
        check_policy(on_failure)
        period = split.rate.period
        if redis_params(Rate(1, period), None, None)[1] != redis_params(split.rate, None, None)[1]:
            raise ConfigurationError(
                f"region split {split.name!r}: {split.rate} is too large for its regional"
                " counts to carry over a change of the limit; use a shorter window"
            )
        self.split, self.region, self.store = split, region, store
        self._view = _View(split, region)
        self._given_clock = clock
        self.clock: Clock = clock if clock is not None else default_clock()
        self._keys = split.keys()
        self._algorithm = get_algorithm(split.algorithm)
        self._on_failure: OnFailure = on_failure
        self._rule = split.name if name is None else name
        self._bound: Bound | None = None
        self._bound_limit = -1
        self._count = threading.Lock()
        self._polling = threading.Lock()
        self._bind(self._view.limit)

    @property
    def limit(self) -> int:
        return self._view.limit

    def hit(self, key: str, cost: int = 1) -> Decision:
        return self._check(key, cost, hit=True)

    def peek(self, key: str, cost: int = 1) -> Decision:
        return self._check(key, cost, hit=False)

    def _check(self, key: str, cost: int, *, hit: bool) -> Decision:
        now = self.clock.time_ns()
        if now >= self._view.due:
            self.refresh(now)
        bound = self._bound
        if bound is None:
            decision = self._none(now)
        else:
            decision = bound.hit(key, cost) if hit else bound.peek(key, cost)
        if hit:
            with self._count:
                self._view.asked += cost
                if decision.allowed:
                    self._view.used += cost
        return decision

    def refresh(self, now: int | None = None) -> int:
        """Poll now if a poll is due (else only apply a change of the limit that
        came due by time); the limit in force."""
        view = self._view
        if now is None:
            now = self.clock.time_ns()
        if not self._polling.acquire(blocking=False):
            return view.limit  # another thread is at it; the current limit holds meanwhile
        try:
            if now >= view.poll_at:
                self._poll(now)
            self._bind(view.evaluate(now))
        finally:
            self._polling.release()
        return view.limit

    def _poll(self, now: int) -> None:
        view = self._view
        limit_key, demand_key = self._keys
        with self._count:
            counts = view.take_counts()
        try:
            pipe = self.store.client.pipeline(transaction=False)
            if counts[0]:
                pipe.hincrby(demand_key, "asked", counts[0])
            if counts[1]:
                pipe.hincrby(demand_key, "used", counts[1])
            pipe.hgetall(limit_key)
            if self._given_clock is None:
                pipe.time()
            replies = pipe.execute()
        except FAILURES as exc:
            log.debug("region %r: cannot read its limit: %s", self.region, exc)
            with self._count:
                view.on_failure(counts, now)
            return
        regional = None
        if self._given_clock is None:
            seconds, micros = replies[-1]
            regional = int(seconds) * 1000 + int(micros) // 1000
            replies = replies[:-1]
        view.on_poll(replies[-1], regional, self.clock.time_ns())

    def _bind(self, limit: int) -> None:
        if limit == self._bound_limit:
            return
        self._bound_limit = limit
        if limit <= 0:
            self._bound = None
            return
        self._bound = self.store.bind(
            self._algorithm,
            Rate(limit, self.split.rate.period),
            burst=None,
            prefix=self.split.prefix(),
            rule=self._rule,
            on_failure=self._on_failure,
        )

    def _none(self, now: int) -> Decision:
        """A regional limit of 0: denied here, retry at the next window edge."""
        period = self.split.rate.period_ns
        wait = (period - now % period) / 1e9
        return Decision(False, 0, 0, 0.0, wait, self._rule)

    def __repr__(self) -> str:
        mode = "dynamic" if self.split.dynamic else "static"
        return (
            f"RegionalLimiter({self.split.name!r}, region={self.region!r}, {mode},"
            f" limit={self.limit}/{self.split.rate.period:g}s, store={self.store!r})"
        )


class RegionRebalancer:
    """Moves ``region``'s limit: every ``split.refresh`` seconds it reads the
    region's demand from the ``regional`` Redis, refreshes the region's
    membership of the fleet resource ``split.name`` on the ``home`` Redis (which
    it creates if it does not exist), and writes the grant as the regional limit.

    ``regional`` and ``home``: URLs or ``redis.Redis`` clients; ``home`` may also
    be a coordinator (an object with `Coordinator`'s ``refresh`` and ``set``).
    Run one per region (the region's name is its member id). ``tick()`` does one
    round; ``start()`` runs rounds on a thread until ``close()``. Closing does not
    leave the resource: the region keeps its grant until the lease ends, as after
    a crash, so that a rebalancer started in its place takes over seamlessly.
    ``clock``: a test clock, sent to the coordinator and read instead of the
    regional Redis's TIME.
    """

    def __init__(
        self,
        split: RegionSplit,
        region: str,
        regional: Any,
        home: Any,
        *,
        clock: Clock | None = None,
        timeout: float = 0.5,
    ) -> None:
        if not split.dynamic:
            raise ConfigurationError(f"region split {split.name!r} is static: nothing to move")
        self.split, self.region = split, split.check_region(region)
        self.client = connect(regional, timeout) if isinstance(regional, str) else regional
        if isinstance(home, str):
            home = connect(home, timeout)
        self.coordinator = (
            home if hasattr(home, "refresh") else Coordinator(home, split.name, clock=clock)
        )
        self.clock = clock
        self._monotonic: Callable[[], int] = time.monotonic_ns if clock is None else clock.time_ns
        self.demand = Demand(split.window_ms)
        self.record: Record | None = None  # what it wrote last
        self.grant_m = 0
        self.pieces: tuple[Piece, ...] = ()
        self.members = 0
        self.known: dict[str, str] | None = None
        self._last_ms: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> Record | None:
        """One round; the record written, or None when a Redis did not answer
        (the region's limiters then keep the last record until its lease ends)."""
        split = self.split
        limit_key, demand_key = split.keys()
        started = self._monotonic()
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.hgetall(demand_key)
            pipe.delete(demand_key)
            pipe.hgetall(limit_key)
            pipe.time()
            counts, _, raw, (seconds, micros) = pipe.execute()
        except FAILURES as exc:
            log.warning("region %r: the regional Redis does not answer: %s", self.region, exc)
            return None
        if self.clock is not None:
            sent_ms = self.clock.time_ns() // 1_000_000
        else:
            sent_ms = int(seconds) * 1000 + int(micros) // 1000
        counted = {text(k): int(v) for k, v in counts.items()}
        asked, used = counted.get("asked", 0), counted.get("used", 0)
        elapsed = 0 if self._last_ms is None else sent_ms - self._last_ms
        self._last_ms = sent_ms
        wants = self.demand.add(asked, elapsed)
        if wants is None:  # not measured yet: its static share
            wants = split.static[self.region] * MILLI
        used_m = used * split.window_ms * MILLI // elapsed if elapsed > 0 else 0
        try:
            reply = self._refresh(wants, used_m)
            if reply is None:
                self.coordinator.set(split.quota_config())
                reply = self._refresh(wants, used_m)
        except StoreUnavailable as exc:
            log.warning("region %r: the home Redis does not answer: %s", self.region, exc)
            return None
        if reply is None:
            return None
        self.grant_m, self.pieces, self.members = reply.grant, reply.pieces, reply.members
        self.known = {k: v for k, v in reply.fields.items() if k not in _TRANSIENT}
        now_ms = sent_ms + (self._monotonic() - started) // 1_000_000
        record = next_limits(
            split,
            self.region,
            before=parse_record(raw),
            grant_m=reply.grant,
            members=reply.members,
            now_ms=now_ms,
            sent_ms=sent_ms,
        )
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.hset(limit_key, mapping=record_fields(record))
            pipe.pexpire(limit_key, 2 * record.lease_ms + GARBAGE_MS)
            pipe.execute()
        except FAILURES as exc:
            log.warning("region %r: cannot write its limit: %s", self.region, exc)
            return None
        self.record = record
        return record

    def _refresh(self, wants: int, used: int) -> Any:
        report = Report(wants, self.grant_m, used, pieces=tuple(self.pieces), restore=self.known)
        return self.coordinator.report(self.region, report)

    def start(self) -> RegionRebalancer:
        """A round now, then one every ``refresh`` seconds (±10%) on a thread."""
        if self._thread is None:
            self.tick()
            self._thread = threading.Thread(
                target=self._run, name=f"ratewarden-region-{self.region}", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.split.refresh * random.uniform(0.9, 1.1)):
            try:
                self.tick()
            except Exception:  # never let the thread die: the region's limit would freeze
                log.exception("region %r: rebalancing failed", self.region)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> RegionRebalancer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        limit = None if self.record is None else self.record.limit
        return (
            f"RegionRebalancer({self.split.name!r}, region={self.region!r},"
            f" wants={self.demand.wants}, grant_m={self.grant_m}, limit={limit},"
            f" members={self.members})"
        )

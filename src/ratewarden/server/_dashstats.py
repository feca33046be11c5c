"""The dashboard's top limited keys: a space-saving sketch in bounded memory.

Keys come from clients, so counting each one exactly would let a client that
sends a million distinct keys make the service hold a million counters. The
space-saving algorithm (Metwally, Agrawal, El Abbadi, 2005) keeps ``capacity``
counters: a key already counted is incremented; a new key, when the counters
are full, takes the place of the key with the lowest count and starts from
that count plus one, its ``error`` being the count it inherited. Every key
counted more than ``n / capacity`` times out of ``n`` is guaranteed a counter,
and a count is never below the true one nor above it by more than ``error``.

The counters are kept in buckets of equal count (the "stream summary"), so
that finding the lowest count is O(1) and an update costs a few dict
operations whatever the capacity. `TopKeys` keeps two generations of sketches
and rotates them every ``window`` seconds, so that what it shows is the last
one to two windows, not everything since the process started.

What the dashboard shows that the service counts as it checks: rates per
rule, second by second, and the keys denied most.

The per-request cost is kept to what the metrics already pay. The rates are
not counted again: once a second `DashboardStats.sample` takes the difference
of the per-rule counters `Metrics` keeps anyway (``ratewarden_checks``,
``_over_limit``, ``_shadow_over_limit``). A check adds one integer increment
(requests that a rule applied to, so that the totals do not count a request
once per rule), and a denied one a few dict operations in `TopKeys`.

Memory is bounded whatever clients send: ``history`` seconds of points, each
with at most ``max_rules`` rules (the rest summed as ``other``), and the
sketch's fixed number of counters for keys.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

if TYPE_CHECKING:
    from ..envoy import EnvoyResult
    from ..rules import Outcome
    from ._metrics import Metrics


__all__ = [
    "MAX_KEY",
    "DashboardStats",
    "Point",
    "SpaceSaving",
    "TopKeys",
]

T = TypeVar("T", bound=Hashable)

MAX_KEY = 200  # characters of a key kept: a longer one is cut, so a counter's size is bounded


class SpaceSaving(Generic[T]):
    """At most ``capacity`` counters; ``add(item)`` counts one occurrence."""

    __slots__ = ("_buckets", "_low", "capacity", "counts", "errors", "total")

    def __init__(self, capacity: int) -> None:
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        self.counts: dict[T, int] = {}
        self.errors: dict[T, int] = {}
        # count -> the items with that count, oldest first (a dict as an ordered set)
        self._buckets: dict[int, dict[T, None]] = {}
        self._low = 0  # the lowest count held (0 while empty)
        self.total = 0  # occurrences counted, all items together

    def add(self, item: T) -> None:
        self.total += 1
        counts = self.counts
        buckets = self._buckets
        count = counts.get(item)
        if count is not None:
            bucket = buckets[count]
            del bucket[item]
            if not bucket:
                del buckets[count]
                if count == self._low:
                    self._low = count + 1  # the item itself now holds the lowest count
            counts[item] = count + 1
            above = buckets.get(count + 1)
            if above is None:
                buckets[count + 1] = {item: None}
            else:
                above[item] = None
            return
        if len(counts) < self.capacity:
            counts[item] = 1
            self.errors[item] = 0
            ones = buckets.get(1)
            if ones is None:
                buckets[1] = {item: None}
            else:
                ones[item] = None
            self._low = 1
            return
        # full: the oldest item of the lowest count gives its counter up
        low = self._low
        bucket = buckets[low]
        victim = next(iter(bucket))
        del bucket[victim], counts[victim], self.errors[victim]
        counts[item] = low + 1
        self.errors[item] = low
        above = buckets.get(low + 1)
        if above is None:
            buckets[low + 1] = {item: None}
        else:
            above[item] = None
        if not bucket:
            del buckets[low]
            self._low = low + 1

    def __len__(self) -> int:
        return len(self.counts)

    def __repr__(self) -> str:
        return f"<SpaceSaving {len(self.counts)}/{self.capacity} counters, {self.total} counted>"


class TopKeys:
    """The keys denied most over the last one to two ``window``\\ s: (rule, key)
    pairs counted in two space-saving generations of ``capacity`` counters."""

    def __init__(self, capacity: int = 64, window: float = 60.0) -> None:
        if not window > 0:
            raise ValueError(f"window must be > 0 seconds, got {window!r}")
        self.capacity = capacity
        self.window = window
        self.current: SpaceSaving[tuple[str, str]] = SpaceSaving(capacity)
        self.previous: SpaceSaving[tuple[str, str]] = SpaceSaving(capacity)
        self.rotated_at: float | None = None

    def add(self, rule: str, key: str) -> None:
        if len(key) > MAX_KEY:
            key = key[:MAX_KEY] + "\u2026"
        self.current.add((rule, key))

    def rotate_if_due(self, now: float) -> None:
        """Start a new generation once ``window`` seconds have passed since the last."""
        if self.rotated_at is None:
            self.rotated_at = now
        elif now - self.rotated_at >= self.window:
            self.previous = self.current
            self.current = SpaceSaving(self.capacity)
            self.rotated_at = now

    def top(self, n: int) -> list[dict[str, Any]]:
        """The ``n`` most denied (rule, key) pairs, highest count first. ``denied``
        is never below the denials counted while the pair held a counter, and at
        most ``error`` above them (what it inherited from the pairs it replaced)."""
        current, previous = self.current, self.previous
        merged: dict[tuple[str, str], tuple[int, int]] = {}
        for sketch in (previous, current):
            for item, count in sketch.counts.items():
                seen, error = merged.get(item, (0, 0))
                merged[item] = (seen + count, error + sketch.errors[item])
        ranked = sorted(merged.items(), key=lambda pair: (-pair[1][0], pair[0]))
        return [
            {"rule": rule, "key": key, "denied": count, "error": error}
            for (rule, key), (count, error) in ranked[:n]
        ]

    @property
    def counted(self) -> int:
        """Denials counted over the window shown."""
        return self.current.total + self.previous.total

    def __repr__(self) -> str:
        return f"<TopKeys window={self.window:g}s current={self.current!r}>"


HISTORY = 300  # seconds of rates kept: the charts' five minutes
MAX_RULES = 20  # rules a point carries by name; the others are summed as "other"


class Point(msgspec.Struct):
    """One sample: the ``dt`` seconds up to ``t`` (unix seconds). ``requests``:
    checks that a rule applied to; ``denied``, ``shadow``: of those, denied, and
    denied by a log_only rule's count had it been enforced. ``rules``: rule ->
    [allowed, denied, shadow] where a rule's "allowed" is a request it let pass
    (another rule may have denied it); ``other``: the same, summed, for the rules
    past `MAX_RULES`. ``store_errors``: checks the store could not decide."""

    t: float
    dt: float
    requests: int
    denied: int
    shadow: int
    store_errors: int
    rules: dict[str, list[int]]
    other: list[int] | None = None


class DashboardStats:
    """``counts``: the metrics' per-rule dicts (checks, over limit, near limit,
    shadow over limit); ``store_errors``: reads the store errors counted so far."""

    def __init__(
        self,
        counts: tuple[dict[str, int], ...],
        store_errors: Callable[[], float],
        *,
        history: int = HISTORY,
        max_rules: int = MAX_RULES,
        top: TopKeys | None = None,
        interval: float = 1.0,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self._checks, self._over, _, self._shadow = counts
        self._store_errors = store_errors
        self.max_rules = max_rules
        self.interval = interval
        self.requests = 0  # checks a rule applied to: the service's hook counts them
        self.top = TopKeys() if top is None else top
        self.points: deque[Point] = deque(maxlen=history)
        self.listeners: list[Callable[[], None]] = []
        self.loaded_at = time.time()
        # the last reload: (unix seconds, None if it worked, else why not)
        self.reloaded: tuple[float, str | None] | None = None
        self._last: tuple[float, int, float, dict[str, int], dict[str, int], dict[str, int]] = (
            0.0, 0, 0.0, {}, {}, {},
        )  # fmt: skip
        self._sampled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def for_metrics(cls, metrics: Metrics, *, interval: float = 1.0) -> DashboardStats:
        """Stats over the counters ``metrics`` keeps for its scrape, read here
        rather than counted a second time on every check."""
        return cls(metrics.rule_counts, metrics.store_error_count, interval=interval)

    # -- the hooks the service calls --------------------------------------------------

    def denied(self, rule: str, key: str) -> None:
        """A request denied by ``rule`` (or a log_only rule that would have) for ``key``."""
        self.top.add(rule, key)

    def limited(self, outcome: Outcome, denied: str | None, shadow: str | None) -> None:
        """A rule engine's denial (``denied``) or shadow denial (``shadow``): the
        keys of the rules that spoke, from the limits that applied."""
        for rule in (denied, shadow):
            if rule is not None:
                key = ""
                for applied in outcome.limits:
                    if applied.rule.name == rule:
                        key = applied.key
                        break
                self.top.add(rule, key)

    def limited_envoy(self, answer: EnvoyResult, denied: str | None, shadow: str | None) -> None:
        """The same for an envoy domain's answer: the denying descriptor's counter key."""
        for rule in (denied, shadow):
            if rule is not None:
                keys = (limit.key for limit in answer.limits
                        if limit is not None and rule in (limit.path, limit.name))  # fmt: skip
                key = next(keys, "")
                self.top.add(rule, key)

    def reload_done(self, error: str | None) -> None:
        self.reloaded = (time.time(), error)

    # -- sampling -----------------------------------------------------------------------

    def sample(self, now: float) -> Point | None:
        """Take the counters' differences since the last sample as one point
        (None the first time: that one is the baseline)."""
        checks, over, shadow = dict(self._checks), dict(self._over), dict(self._shadow)
        requests, errors = self.requests, self._store_errors()
        last_t, last_requests, last_errors, last_checks, last_over, last_shadow = self._last
        self._last = (now, requests, errors, checks, over, shadow)
        self.top.rotate_if_due(now)
        if not self._sampled:
            self._sampled = True
            return None
        per_rule: dict[str, list[int]] = {}
        for column, (new, old) in enumerate(
            ((checks, last_checks), (over, last_over), (shadow, last_shadow))
        ):
            for rule, count in new.items():
                delta = count - old.get(rule, 0)
                if delta > 0:
                    per_rule.setdefault(rule, [0, 0, 0])[column] += delta
        busiest = per_rule
        if len(per_rule) > self.max_rules:  # the busiest by name; the rest summed
            ranked = heapq.nsmallest(self.max_rules, per_rule.items(),
                                     key=lambda item: (-sum(item[1]), item[0]))  # fmt: skip
            busiest = dict(ranked)
        rules = {rule: [max(c - d, 0), d, s] for rule, (c, d, s) in busiest.items()}
        other = None
        if len(busiest) < len(per_rule):
            checked = sum(row[0] for row in per_rule.values()) - sum(r[0] for r in busiest.values())
            denied = sum(row[1] for row in per_rule.values()) - sum(r[1] for r in busiest.values())
            shadowed = sum(row[2] for row in per_rule.values()) - sum(
                r[2] for r in busiest.values()
            )
            other = [max(checked - denied, 0), denied, shadowed]
        point = Point(
            t=now,
            dt=round(now - last_t, 3),
            requests=requests - last_requests,
            denied=sum(row[1] for row in per_rule.values()),
            shadow=sum(row[2] for row in per_rule.values()),
            store_errors=int(errors - last_errors),
            rules=rules,
            other=other,
        )
        self.points.append(point)
        return point

    def since(self, t: float) -> list[Point]:
        """The points after ``t``, oldest first."""
        out: list[Point] = []
        for point in reversed(self.points):
            if point.t <= t:
                break
            out.append(point)
        out.reverse()
        return out

    # -- the timer ------------------------------------------------------------------------

    def start(self) -> None:
        """Sample every ``interval`` seconds on the running event loop, from now
        on (again on a new loop: a test's, or after the last one closed)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._timer is not None:
            return
        self._loop = loop
        self._tick()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        self._timer = loop.call_later(self.interval, self._tick)
        self.sample(time.time())
        for listener in list(self.listeners):
            listener()

    def __repr__(self) -> str:
        running = "sampling" if self._timer is not None else "stopped"
        return f"<DashboardStats {running} every {self.interval:g}s, {len(self.points)} points>"

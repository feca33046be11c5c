"""What the dashboard shows that the service counts as it checks: rates per
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
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from ._dashsketch import TopKeys

if TYPE_CHECKING:
    from ..rules import Outcome
    from ..rules._envoyresult import EnvoyResult
    from ._metrics import Metrics

__all__ = ["DashboardStats", "Point"]

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

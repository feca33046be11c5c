"""Deliberately naive reference models of every algorithm.

Each model keeps the plain list of admitted ``(tick, cost)`` and answers from the
definition alone, with exact fractions where rates divide unevenly. Retry and reset
times are found by brute-force search over ticks, not by formula, so the models
share no arithmetic with the code under test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from ratewarden.algorithms import Algorithm, get_algorithm

History = list[tuple[int, int]]


@dataclass
class Model:
    limit: int
    period: int
    burst: int
    history: History = field(default_factory=list)

    # -- the definition, one per algorithm ---------------------------------------
    def allows(self, now: int, cost: int) -> bool:
        raise NotImplementedError

    def whole(self, now: int) -> bool:
        """True when the state at ``now`` is as if nothing had ever been admitted."""
        raise NotImplementedError

    bucket = False  # buckets hold ``burst``, windows ``limit``

    @property
    def capacity(self) -> int:
        return self.burst if self.bucket else self.limit

    # -- derived by brute force ---------------------------------------------------
    def horizon(self) -> int:
        return 2 * self.period * (1 + -(-self.burst // self.limit)) + 2

    def remaining(self, now: int) -> int:
        return max(k for k in range(self.capacity + 1) if k == 0 or self.allows(now, k))

    def first_pass(self, now: int, cost: int) -> float:
        if cost > self.capacity:
            return math.inf
        for t in range(now, now + self.horizon()):
            if self.allows(t, cost):
                return t - now
        raise AssertionError("model: no pass within the horizon")

    def reset_after(self, now: int) -> float:
        for t in range(now, now + self.horizon()):
            if self.whole(t):
                return t - now
        raise AssertionError("model: never whole within the horizon")

    def hit(self, now: int, cost: int) -> tuple[bool, int, float, float]:
        """(allowed, remaining, retry_after, reset_after) in ticks, admitting if allowed.

        Typed as Decision's fields: mypy narrows a tuple compared with one whose
        element types differ (int for float) to nothing."""
        if self.allows(now, cost):
            self.history.append((now, cost))
            return True, self.remaining(now), 0, self.reset_after(now)
        return False, self.remaining(now), self.first_pass(now, cost), self.reset_after(now)

    def in_window(self, lo: int, hi: int) -> int:
        """Cost admitted at ticks ``lo <= t < hi``."""
        return sum(c for t, c in self.history if lo <= t < hi)


class FixedWindow(Model):
    def allows(self, now: int, cost: int) -> bool:
        start = now // self.period * self.period
        return self.in_window(start, start + self.period) + cost <= self.limit

    def whole(self, now: int) -> bool:
        start = now // self.period * self.period
        return self.in_window(start, start + self.period) == 0


class SlidingWindowLog(Model):
    def allows(self, now: int, cost: int) -> bool:
        return self.in_window(now - self.period + 1, now + 1) + cost <= self.limit

    def whole(self, now: int) -> bool:
        return self.in_window(now - self.period + 1, now + 1) == 0


class SlidingWindowCounter(Model):
    def _counts(self, now: int) -> tuple[int, int, Fraction]:
        start = now // self.period * self.period
        prev = self.in_window(start - self.period, start)
        curr = self.in_window(start, start + self.period)
        weight = Fraction(start + self.period - now, self.period)
        return prev, curr, weight

    def allows(self, now: int, cost: int) -> bool:
        prev, curr, weight = self._counts(now)
        return prev * weight + curr + cost <= self.limit

    def whole(self, now: int) -> bool:
        prev, curr, _ = self._counts(now)
        return prev == curr == 0


class TokenBucket(Model):
    """Tokens: start full at ``burst``, refill ``limit/period`` per tick, capped."""

    bucket = True

    def tokens(self, now: int) -> Fraction:
        tokens, last = Fraction(self.burst), None
        rate = Fraction(self.limit, self.period)
        for t, c in [*self.history, (now, 0)]:
            if last is not None:
                tokens = min(Fraction(self.burst), tokens + (t - last) * rate)
            tokens -= c
            last = t
        return tokens

    def allows(self, now: int, cost: int) -> bool:
        return self.tokens(now) >= cost

    def whole(self, now: int) -> bool:
        return self.tokens(now) == self.burst


class LeakyBucket(Model):
    """A meter: each admitted unit adds to a level that leaks ``limit/period`` per tick;
    a request passes if the level plus its cost stays within ``burst``."""

    bucket = True

    def level(self, now: int) -> Fraction:
        level, last = Fraction(0), None
        leak = Fraction(self.limit, self.period)
        for t, c in [*self.history, (now, 0)]:
            if last is not None:
                level = max(Fraction(0), level - (t - last) * leak)
            level += c
            last = t
        return level

    def allows(self, now: int, cost: int) -> bool:
        return self.level(now) + cost <= self.burst

    def whole(self, now: int) -> bool:
        return self.level(now) == 0


class Gcra(Model):
    """Virtual scheduling: emission interval T = period/limit, tolerance
    tau = (burst - 1) * T; a request of cost c conforms if it arrives no earlier than
    TAT - tau + (c - 1) * T (its last unit conforms), and then moves TAT to max(TAT, t) + c * T."""

    bucket = True

    def tat(self) -> Fraction | None:
        interval = Fraction(self.period, self.limit)
        tat: Fraction | None = None
        for t, c in self.history:
            tat = max(tat if tat is not None else Fraction(t), Fraction(t)) + c * interval
        return tat

    def allows(self, now: int, cost: int) -> bool:
        tat = self.tat()
        if tat is None:
            return cost <= self.burst
        interval = Fraction(self.period, self.limit)
        tau = (self.burst - 1) * interval
        return cost <= self.burst and now >= tat - tau + (cost - 1) * interval

    def whole(self, now: int) -> bool:
        tat = self.tat()
        return tat is None or tat <= now


class IntervalBucket(Model):
    """``burst`` tokens per period; the period starts at the first take from a full
    bucket and the bucket is full again, all at once, when it ends."""

    bucket = True

    def tokens(self, now: int) -> int:
        tokens, refill_at = self.burst, None
        for t, c in [*self.history, (now, 0)]:
            if refill_at is not None and t >= refill_at:
                tokens, refill_at = self.burst, None
            if c and refill_at is None:
                refill_at = t + self.period
            tokens -= c
        return tokens

    def allows(self, now: int, cost: int) -> bool:
        return self.tokens(now) >= cost

    def whole(self, now: int) -> bool:
        return self.tokens(now) == self.burst


MODELS: dict[str, type[Model]] = {
    "fixed_window": FixedWindow,
    "sliding_window_log": SlidingWindowLog,
    "sliding_window_counter": SlidingWindowCounter,
    "token_bucket": TokenBucket,
    "leaky_bucket": LeakyBucket,
    "gcra": Gcra,
    "token_bucket(interval)": IntervalBucket,
}

ALGOS: dict[str, Algorithm] = {
    name: get_algorithm("token_bucket", refill="interval")
    if name == "token_bucket(interval)"
    else get_algorithm(name)
    for name in MODELS
}

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
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Generic, TypeVar

__all__ = ["MAX_KEY", "SpaceSaving", "TopKeys"]

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

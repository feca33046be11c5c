"""Hot-key sharding: one key's limit split into N exact limits ("shards") whose keys
live in different cluster slots, so that one busy key spreads over the nodes.

Shard i of n holds ``limit // n`` of the rate (the first ``limit % n`` shards one
more), its bucket ``burst // n`` likewise: the shards' limits add up to the limit.
A check asks one shard and, when that one denies, the next, until one admits or
every shard has denied. So, with each shard exact in its store:

- the key never admits more than its limit (the sum of the shards');
- a request of cost c is denied only when every shard, when last asked, lacked room
  for c: what the key leaves unused is less than n * c.

That is why the limit is partitioned rather than counted in n counters summed on
every read: a sum costs a read on every node per check, which is the load sharding
is meant to spread, and it races between the reads and the write.

A shard that denied cost c with ``retry_after`` r denies every cost >= c for r
seconds (other traffic only adds to a count), so it is remembered here and not
asked again before then; the time is taken before the shard is asked, so what is
remembered runs out early, never late. A key over its limit thus costs a round trip
per shard per ``retry_after``, not per check. (A ``reset`` from another process is
not seen here: its shards count as full until their time is up.)

Placement: a shard's key is ``prefix + "shard<i>/<n>:" + "{tag}" + key``. The tag is
the first ``{...}`` in the key, so it alone picks the cluster slot: it is chosen so
that the key's shards sit evenly round the 16384 slots, starting from a point the
key hashes to. On 3 masters, 6 shards put 2 on each; and different keys' shards
start at different slots, so that many sharded keys still use every node.

Decisions of a sharded limit carry its whole limit as ``limit``; ``remaining`` and
``reset_after`` are those of the shard that answered (``remaining`` is then a lower
bound of what the key has left).

With ``promote_at`` a key starts on its own counter (the unsharded limit's) and
moves to its shards while this process checks it ``promote_at`` times a second or
more, back below half that. The shards do not know what the counter has counted,
nor the counter what the shards have: in the period after a switch (and while
processes disagree about the key) the key admits up to twice its limit.
"""

from __future__ import annotations

import itertools
import random
from binascii import crc_hqx
from collections.abc import Generator, Sequence
from functools import cache, partial
from typing import Any, TypeAlias

from ..algorithms import Algorithm
from ..primitives import Clock, ConfigurationError, Decision, Rate, adrive, drive
from .base import AsyncBound, AsyncStore, BindOptions, Bound, Check, Store, check_cost

__all__ = [
    "MAX_SHARDS",
    "Shards",
    "abind",
    "ahit_many",
    "ahit_tiers",
    "bind",
    "check_shards",
    "hit_many",
    "hit_tiers",
    "split",
]

MAX_SHARDS = 256
_SLOTS = 16384  # Redis Cluster's slots: CRC16 of the hash tag, mod 16384
_RING = 1024  # tags for 1024 evenly spaced slot ranges (16 slots each) are plenty
_FORGET = 4096  # keys remembered as full, or sampled for promotion, before starting over
_SAMPLE_NS = 1_000_000_000  # promotion measures a key's rate over a second
_WHOLE = -1  # the "shard" that is the key's own, unsharded counter

Flow: TypeAlias = Generator[tuple[int, str], Decision, Decision]


@cache
def _tags() -> tuple[str, ...]:
    """A hash tag per slot range: tag j puts a key in slots [16j, 16j + 16)."""
    tags: list[str] = [""] * _RING
    left, j = _RING, 0
    while left:
        text = format(j, "x")
        at = (crc_hqx(text.encode(), 0) % _SLOTS) * _RING // _SLOTS
        if not tags[at]:
            tags[at] = "{" + text + "}"
            left -= 1
        j += 1
    return tuple(tags)


def check_shards(shards: object, promote_at: object = None) -> None:
    if type(shards) is not int or not 1 <= shards <= MAX_SHARDS:
        raise ConfigurationError(
            f"shards must be an integer from 1 to {MAX_SHARDS}, got {shards!r}"
        )
    if promote_at is not None:
        if isinstance(promote_at, bool) or not isinstance(promote_at, int | float):
            raise ConfigurationError(f"promote_at must be checks per second, got {promote_at!r}")
        if not 0 < promote_at < float("inf"):
            raise ConfigurationError(f"promote_at must be finite and > 0, got {promote_at!r}")
        if shards == 1:
            raise ConfigurationError("promote_at needs shards of at least 2 to promote keys to")


def split(total: int, n: int) -> list[int]:
    """``total`` in ``n`` parts that differ by at most one, the larger first."""
    return [total // n + (i < total % n) for i in range(n)]


class Shards:
    """One sharded limit: its shards' tiers, the rotation, what is known full, and
    which keys are promoted. No I/O: `flow` says which shard to ask next."""

    def __init__(
        self,
        tiers: Sequence[Any],
        sizes: Sequence[int],
        whole: Any,
        size: int,
        *,
        rule: str | None,
        clock: Clock,
        promote_at: float | None,
    ) -> None:
        self.n = len(tiers)
        self.tiers, self.sizes = list(tiers), list(sizes)
        self.whole, self.size, self.rule, self.clock = whole, size, rule, clock
        self.promote_at = promote_at
        self._offsets = [i * _RING // self.n for i in range(self.n)]
        # where each process starts its rotation: spread, so that processes that
        # start together do not all ask shard 0 first
        self._turn = itertools.count(random.randrange(self.n)).__next__
        self._full: dict[str, list[tuple[float, float, int] | None]] = {}
        self._seen: dict[str, list[int]] = {}  # key -> [sample start, checks, promoted]

    def key(self, key: str, shard: int) -> str:
        if shard == _WHOLE:
            return key
        base = crc_hqx(key.encode(), 0)
        return _tags()[(base + self._offsets[shard]) % _RING] + key

    def tier_size(self, shard: int) -> int:
        return self.size if shard == _WHOLE else self.sizes[shard]

    def flow(self, key: str, cost: int) -> Flow:
        """Yields (shard, its key) to ask, is sent the Decision, returns the key's
        (see the module docstring for the order and what is remembered)."""
        if cost != 1:
            check_cost(cost)
        now = self.clock.time_ns()
        if self.promote_at is not None and not self._promoted(key, now):
            return (yield _WHOLE, key)
        known = self._full.get(key)
        base = crc_hqx(key.encode(), 0)
        tags, offsets, n = _tags(), self._offsets, self.n
        start = self._turn() % n
        retry_at, reset_at = float("inf"), 0.0
        for step in range(n):
            shard = (start + step) % n
            entry = None if known is None else known[shard]
            if entry is None or entry[0] <= now or cost < entry[2]:
                decision = yield shard, tags[(base + offsets[shard]) % _RING] + key
                if decision.allowed or decision.degraded:
                    return self.speak(decision)
                entry = (now + decision.retry_after * 1e9, now + decision.reset_after * 1e9, cost)
                if known is None:
                    if len(self._full) >= _FORGET:
                        self._full.clear()
                    known = self._full[key] = [None] * n
                known[shard] = entry
            retry_at, reset_at = min(retry_at, entry[0]), max(reset_at, entry[1])
        return Decision(False, self.size, 0, (reset_at - now) / 1e9, (retry_at - now) / 1e9,
                        self.rule)  # fmt: skip

    def speak(self, decision: Decision) -> Decision:
        """A shard's Decision as the key's: the whole limit."""
        return Decision(
            decision.allowed, self.size, decision.remaining, decision.reset_after,
            decision.retry_after, decision.rule, decision.degraded,
        )  # fmt: skip

    def forget(self, key: str) -> None:
        self._full.pop(key, None)

    def resets(self, key: str) -> Generator[tuple[int, str], Any, None]:
        """Forgets what is known of ``key``, then yields each shard to reset and its
        key there (and the key's own counter, if keys are promoted)."""
        self.forget(key)
        for shard in range(self.n):
            yield shard, self.key(key, shard)
        if self.whole is not None:
            yield _WHOLE, key

    def _promoted(self, key: str, now: int) -> bool:
        """Count this check; whether the key goes to its shards."""
        seen = self._seen.get(key)
        if seen is None:
            if len(self._seen) >= _FORGET:  # keep the promoted keys, sample the rest anew
                kept = {k: v for k, v in self._seen.items() if v[2]}
                self._seen = kept if len(kept) < _FORGET // 2 else {}
            seen = self._seen[key] = [now, 0, 0]
        seen[1] += 1
        elapsed = now - seen[0]
        if elapsed >= _SAMPLE_NS:
            rate = seen[1] * 1e9 / elapsed
            assert self.promote_at is not None
            seen[2] = rate >= (self.promote_at / 2 if seen[2] else self.promote_at)
            seen[0], seen[1] = now, 0
        return bool(seen[2])

    def promoted(self) -> list[str]:
        """The keys this process sends to their shards now (for metrics and tests)."""
        return [key for key, seen in self._seen.items() if seen[2]]

    def __repr__(self) -> str:
        promote = "" if self.promote_at is None else f", promote_at={self.promote_at}"
        return f"<Shards n={self.n} size={self.size}{promote}>"


def _parts(
    algorithm: Algorithm, rate: Rate, options: BindOptions, shards: int
) -> tuple[list[Rate], list[int | None], list[int]]:
    """Each shard's rate, burst and size (what its Decisions call ``limit``)."""
    if rate.limit < shards:
        raise ConfigurationError(
            f"shards={shards} needs a limit of at least {shards} (each shard holds a"
            f" share of it), got {rate.limit}"
        )
    burst = options["burst"]
    if burst is not None and burst < shards:
        raise ConfigurationError(f"shards={shards} needs a burst of at least {shards}, got {burst}")
    prefix = options["prefix"]
    if "{" in prefix or "}" in prefix:
        raise ConfigurationError(
            f"a sharded limit's name must not contain braces, got {options['rule']!r}:"
            " a hash tag in it would pin every shard to one cluster slot"
        )
    limits = split(rate.limit, shards)
    bursts: list[int | None] = [None] * shards if burst is None else list(split(burst, shards))
    rates = [Rate(limit, rate.period) for limit in limits]
    sizes = [
        b if b is not None and algorithm.uses_burst else lim
        for b, lim in zip(bursts, limits, strict=True)
    ]
    return rates, bursts, sizes


def _bind_all(
    store: Any, algorithm: Algorithm, rate: Rate, options: BindOptions, *,
    shards: int, promote_at: float | None,
) -> tuple[Shards, dict[int, Any]]:  # fmt: skip
    """Binds the shards, and the key's own limit if keys are promoted, in ``store``:
    the `Shards`, and each one's `Bound` (or `AsyncBound`) by shard number."""
    rates, bursts, sizes = _parts(algorithm, rate, options, shards)
    bounds = {}
    for i, (part, burst) in enumerate(zip(rates, bursts, strict=True)):
        shard_options = BindOptions(**options)
        shard_options["burst"] = burst
        shard_options["prefix"] = f"{options['prefix']}shard{i}/{shards}:"
        bounds[i] = store.bind(algorithm, part, **shard_options)
    if promote_at is not None:
        bounds[_WHOLE] = store.bind(algorithm, rate, **options)
    size = options["burst"] if options["burst"] is not None and algorithm.uses_burst else rate.limit
    whole = bounds[_WHOLE].tier if promote_at is not None else None
    limit = Shards(
        [bounds[i].tier for i in range(shards)], sizes, whole, size,
        rule=options["rule"], clock=store.clock, promote_at=promote_at,
    )  # fmt: skip
    return limit, bounds


def bind(
    store: Store, algorithm: Algorithm, rate: Rate, options: BindOptions, *,
    shards: int, promote_at: float | None = None,
) -> Bound:  # fmt: skip
    """``store.bind`` of the limit split into ``shards`` (see the module docstring)."""
    limit, bounds = _bind_all(store, algorithm, rate, options, shards=shards, promote_at=promote_at)

    def hit(key: str, cost: int = 1) -> Decision:
        return drive(limit.flow(key, cost), lambda at: bounds[at[0]].hit(at[1], cost))

    def peek(key: str, cost: int = 1) -> Decision:
        return drive(limit.flow(key, cost), lambda at: bounds[at[0]].peek(at[1], cost))

    def reset(key: str) -> None:
        drive(limit.resets(key), lambda at: bounds[at[0]].reset(at[1]))

    return Bound(hit, peek, reset, limit)


def abind(
    store: AsyncStore, algorithm: Algorithm, rate: Rate, options: BindOptions, *,
    shards: int, promote_at: float | None = None,
) -> AsyncBound:  # fmt: skip
    """The asyncio twin of `bind`."""
    limit, bounds = _bind_all(store, algorithm, rate, options, shards=shards, promote_at=promote_at)

    async def hit(key: str, cost: int = 1) -> Decision:
        return await adrive(limit.flow(key, cost), lambda at: bounds[at[0]].hit(at[1], cost))

    async def peek(key: str, cost: int = 1) -> Decision:
        return await adrive(limit.flow(key, cost), lambda at: bounds[at[0]].peek(at[1], cost))

    async def reset(key: str) -> None:
        await adrive(limit.resets(key), lambda at: bounds[at[0]].reset(at[1]))

    return AsyncBound(hit, peek, reset, limit)


class _Side:
    """One side of a multi-tier check (the enforced tiers, or the shadow ones), its
    sharded tiers each at the shard it asks now. ``checks`` is what to send the
    store; `settle` takes the store's answer; ``done`` is the side's Decision."""

    def __init__(self, checks: Sequence[Check]) -> None:
        self.checks = list(checks)
        self.done: Decision | None = None
        self.flows: dict[int, tuple[Shards, Flow, int]] = {}
        for i, (tier, key, cost) in enumerate(checks):
            if type(tier) is Shards:
                flow = tier.flow(key, cost)
                try:
                    shard, shard_key = next(flow)
                except StopIteration as known_full:
                    self.done = known_full.value
                    return
                self._ask(i, tier, flow, shard, shard_key)

    def _ask(self, i: int, limit: Shards, flow: Flow, shard: int, key: str) -> None:
        self.flows[i] = (limit, flow, shard)
        self.checks[i] = (limit.whole if shard == _WHOLE else limit.tiers[shard], key,
                          self.checks[i][2])  # fmt: skip

    def settle(self, decision: Decision) -> None:
        """A denial by a shard sends its tier to the next shard (``done`` stays None:
        ask again); anything else is the side's answer. The tier that answered is
        told by its Decision's ``rule`` and ``limit`` (the shard's size): tiers of
        one check with distinct names are told apart exactly."""
        for i, (limit, flow, shard) in self.flows.items():
            if decision.rule == limit.rule and decision.limit == limit.tier_size(shard):
                if decision.allowed or decision.degraded:
                    self.done = limit.speak(decision) if shard != _WHOLE else decision
                    return
                try:
                    self._ask(i, limit, flow, *flow.send(decision))
                except StopIteration as denied:
                    self.done = denied.value
                return
        self.done = decision


Request: TypeAlias = tuple[list[Check], list[Check] | None]  # hit_tiers(c, s), or hit_many(c)
Answers: TypeAlias = tuple[Decision | None, Decision | None]


def _many(checks: Sequence[Check]) -> Generator[Request, Any, Decision]:
    side = _Side(checks)
    while side.done is None:
        side.settle((yield side.checks, None))
    return side.done


def _tiers(checks: Sequence[Check], shadow: Sequence[Check]) -> Generator[Request, Any, Answers]:
    """`hit_tiers` with sharded tiers: the enforced tiers (the shadow ones in the
    same call) until they settle; then, if a shard among the shadow tiers denied,
    the shadow tiers alone until they settle."""
    watch = _Side(shadow) if shadow else None
    if not checks:
        return None, (None if watch is None else (yield from _settle(watch)))
    side = _Side(checks)
    report = None
    while side.done is None:
        asked = [] if watch is None or watch.done is not None else watch.checks
        decision, report = yield side.checks, asked
        side.settle(decision)
    decision = side.done
    if watch is None or not decision.allowed:
        return decision, None
    if watch.done is None and report is not None:
        watch.settle(report)
    return decision, (yield from _settle(watch))


def _settle(side: _Side) -> Generator[Request, Any, Decision]:
    while side.done is None:
        side.settle((yield side.checks, None))
    return side.done


def _call(store: Any, request: Request) -> Any:
    """A `Request` as ``store`` takes it: ``hit_many``, or ``hit_tiers``."""
    checks, shadow = request
    return store.hit_many(checks) if shadow is None else store.hit_tiers(checks, shadow)


def hit_many(store: Store, checks: Sequence[Check]) -> Decision:
    """``store.hit_many`` with sharded tiers among ``checks``."""
    return drive(_many(checks), partial(_call, store))


async def ahit_many(store: AsyncStore, checks: Sequence[Check]) -> Decision:
    return await adrive(_many(checks), partial(_call, store))


def hit_tiers(store: Store, checks: Sequence[Check], shadow: Sequence[Check]) -> Answers:
    """``store.hit_tiers`` with sharded tiers among ``checks`` or ``shadow``."""
    return drive(_tiers(checks, shadow), partial(_call, store))


async def ahit_tiers(
    store: AsyncStore, checks: Sequence[Check], shadow: Sequence[Check]
) -> Answers:
    return await adrive(_tiers(checks, shadow), partial(_call, store))

"""envoyproxy/ratelimit configurations, applied with that service's semantics.

`EnvoyConfig.load(*paths)` reads its files (a directory: every YAML file in
it; both found and parsed by `_files`), builds a tree per
domain (`_tree`, which also documents the matching), and ``check(domain,
descriptors, hits_addend, overrides)`` is what a gRPC ``ShouldRateLimit`` does:

- a domain no file names has no limits: every descriptor is OK (and counted in
  ``domain_not_found``);
- a descriptor's ``limit`` override (requests per unit) replaces whatever the
  files say for it;
- every limit named in a matched limit's ``replaces`` is dropped; ``unlimited``
  limits never count; ``shadow_mode`` limits count but never deny;
  ``quota_mode`` limits deny the request only when every quota limit of it
  does; ``requests_per_unit: 0`` denies every request;
- windows are fixed, aligned to the unit (as that service's cache keys are).

Counting, ``count_denied=True`` (that service's default): every limit of a
request is counted, each on its own, whether the request is denied or not, so
a client that keeps sending while denied stays denied; the counter belongs to
the descriptor's entries and the unit (not to the limit), as there. With
``count_denied=False`` (its STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) the limits
of one request are counted with one atomic ``hit_tiers``: a request is counted
in all of them, or, denied, in none (as everywhere else in ratewarden).

Statistics per descriptor, keyed as that service keys them, go to `stats`
(`EnvoyStats`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Self, TypedDict, TypeVar, Unpack

from ..kernel import AsyncLimiter, Limiter, LimiterOptions, ahit_tiers, hit_tiers
from ..primitives import ConfigurationError, Decision, Rate
from ..rules.source import Document
from ..stores import AsyncMemoryStore, AsyncStore, MemoryStore, Store
from ._answer import (
    EnvoyLimit,
    EnvoyResult,
    EnvoyStats,
    Override,
    esc,
    override_limit,
    verdict,
)
from ._files import EnvoyFile, envoy_files, parse_files
from ._tree import Level, build, lookup

__all__ = [
    "AsyncEnvoyConfig",
    "EnvoyConfig",
    "EnvoyConfigOptions",
    "EnvoyLimit",
    "EnvoyResult",
    "Override",
]

# A counter limiter's limit: never reached, so every hit is counted and its
# Decision's ``remaining`` tells the count. The Redis store counts exactly while
# limit x period (seconds) stays below 2^53 (Lua's doubles): a year's counter
# holds 285 million, more than any limit written for a year in practice.


def counter_ceiling(period: int) -> int:
    return min(2**50, (2**53 - 1) // period)


# Limiters kept for per-request overrides, most recently used first; one is a
# binding to the store, so one dropped and made again loses no counts.
MAX_OVERRIDE_LIMITERS = 1024
L = TypeVar("L", Limiter, AsyncLimiter)
S = TypeVar("S", Store, AsyncStore)
_Call = tuple[L, str]
_Tier = tuple[L, str, int]


class EnvoyConfigOptions(TypedDict, total=False):
    """The options of `EnvoyConfig` and `AsyncEnvoyConfig` and of their ``load``
    and ``loads`` (see `EnvoyConfig`)."""

    merge: bool
    count_denied: bool
    shadow_mode: bool
    quota_mode: bool
    stats: EnvoyStats | None


@dataclass(slots=True)
class _Matched(Generic[L]):
    """A check without its count: the limits that apply, the request's cost, and
    what the shell counts: ``calls`` (each limit on its own counter), or else
    ``tiers`` (one atomic ``hit_tiers``; None when nothing counts, as when a
    limit of 0 per unit has ``blocked`` the request)."""

    limits: list[EnvoyLimit | None]
    cost: int
    calls: list[_Call[L]] | None = None
    tiers: tuple[list[_Tier[L]], list[_Tier[L]]] | None = None
    blocked: Decision | None = None


class _EnvoyCore(Generic[L, S]):
    """What the twins share: everything but the count. ``store`` holds the counters."""

    def __init__(
        self,
        files: Sequence[tuple[EnvoyFile, Document]],
        store: S,
        *,
        merge: bool = False,
        count_denied: bool = True,
        shadow_mode: bool = False,
        quota_mode: bool = False,
        stats: EnvoyStats | None = None,
    ) -> None:
        self.store: S = store
        self.domains: dict[str, Level] = build(files, merge=merge)
        self.count_denied = count_denied
        self.shadow_mode = shadow_mode  # SHADOW_MODE: every request passes
        self.quota_mode = quota_mode  # QUOTA_MODE: every limit is a quota
        self.stats = EnvoyStats() if stats is None else stats
        self._counters: dict[int, L] = {}
        self._limiters: dict[str, L] = {}
        self._overrides: OrderedDict[tuple[int, int], L] = OrderedDict()

    @classmethod
    def load(
        cls, *paths: str | os.PathLike[str], store: S | None = None,
        **options: Unpack[EnvoyConfigOptions],
    ) -> Self:  # fmt: skip
        """The configuration in the files ``paths`` (a directory: every YAML file in
        it), its counters on ``store`` (a fresh memory store unless given)."""
        with _collector_paused():
            files = parse_files(envoy_files(paths).files)
            return cls(files, cls._fresh_store() if store is None else store, **options)

    @classmethod
    def loads(
        cls, *texts: str, store: S | None = None, **options: Unpack[EnvoyConfigOptions]
    ) -> Self:
        """`load` of the YAML ``texts`` themselves."""
        files = parse_files((), texts)
        return cls(files, cls._fresh_store() if store is None else store, **options)

    @classmethod
    def _fresh_store(cls) -> S:  # the shells override
        raise NotImplementedError

    def _limiter(self, rate: Rate, name: str) -> L:  # the shells override
        raise NotImplementedError

    @staticmethod
    def _counting(name: str) -> LimiterOptions:
        """How every limiter of a configuration counts: in that service's fixed
        windows, letting a request through, as it does, when the store cannot
        answer."""
        return {"algorithm": "fixed_window", "name": name, "on_failure": "fail_open"}

    @property
    def limiters(self) -> list[L]:
        """Every limiter made so far (for resetting a key everywhere)."""
        out: list[L] = list(self._counters.values())
        out += self._limiters.values()
        out += self._overrides.values()
        return out

    # -- matching ---------------------------------------------------------------

    def limits_for(
        self,
        domain: str,
        descriptors: Iterable[Sequence[tuple[str, str]]],
        overrides: Sequence[Override | None] | None = None,
    ) -> list[EnvoyLimit | None]:
        """Per descriptor (a list of ``(key, value)`` entries), the limit that
        applies, or None; after ``replaces`` has dropped what it names."""
        descriptors = list(descriptors)
        root = self.domains.get(domain)
        if root is None:
            for _ in descriptors:
                self.stats.domain_not_found(domain)
            return [None] * len(descriptors)
        found: list[EnvoyLimit | None] = []
        replaced: set[str] = set()
        for i, entries in enumerate(descriptors):
            override = overrides[i] if overrides is not None else None
            if override is not None:
                found.append(override_limit(domain, i, entries, override))
                continue
            match = lookup(domain, root, entries)
            if match is None:
                found.append(None)
                continue
            node, spec = match.node, match.node.limit
            assert spec is not None  # lookup returns nodes with limits
            replaced |= spec.replaces
            shared = match.shared
            parts = [domain]
            for j, (k, v) in enumerate(entries):
                value = v if shared is None or shared[j] is None else shared[j]
                parts.append(f"{esc(k)}={esc(value or '')}")
            limit = EnvoyLimit(
                i, node.path, "|".join(parts), match.stats_key, spec.requests_per_unit,
                spec.unit, spec.period, spec.name, spec.shadow, spec.quota or self.quota_mode,
                spec.unlimited, False, spec.metadata,
            )  # fmt: skip
            found.append(limit)
        if replaced:
            found = [None if f is not None and f.name in replaced else f for f in found]
        return found

    # -- counting ---------------------------------------------------------------

    def _matched(
        self,
        domain: str,
        descriptors: Iterable[Sequence[tuple[str, str]]],
        hits_addend: int,
        overrides: Sequence[Override | None] | None,
    ) -> _Matched[L]:
        """What a check counts, found without counting (see `_Matched`)."""
        cost = _cost(hits_addend)
        limits = self.limits_for(domain, descriptors, overrides)
        if self.count_denied:
            return _Matched(limits, cost, calls=self._calls(limits))
        enforced, shadow, blocked = self._tiers(limits, cost)
        if blocked is not None:
            return _Matched(limits, cost, blocked=blocked)
        return _Matched(limits, cost, tiers=(enforced, shadow) if enforced or shadow else None)

    def _calls(self, limits: list[EnvoyLimit | None]) -> list[_Call[L]]:
        """Counting every limit on its own: a counter per unit, keyed by entries."""
        calls: list[_Call[L]] = []
        for limit in limits:
            if limit is None or limit.unlimited:
                continue
            counter = self._counters.get(limit.period)
            if counter is None:
                rate = Rate(counter_ceiling(limit.period), limit.period)
                counter = self._counters[limit.period] = self._limiter(rate, "envoy")
            calls.append((counter, limit.key))
        return calls

    def _counted(self, matched: _Matched[L], answers: Sequence[Decision]) -> EnvoyResult:
        """The answer from each limit's own count (``matched.calls``), that service's way."""
        limits, cost = matched.limits, matched.cost
        statuses: list[Decision | None] = [None] * len(limits)
        answers_left = iter(answers)
        for i, limit in enumerate(limits):
            if limit is None or limit.unlimited:
                continue
            counted = next(answers_left)
            per_unit = limit.requests_per_unit
            if counted.degraded:
                statuses[i] = Decision(True, per_unit, per_unit, 0.0, 0.0, limit.path, True)
                continue
            after = counter_ceiling(limit.period) - counted.remaining
            before = after - cost
            allowed = after <= per_unit
            reset = counted.reset_after
            # 0 per unit: envoy's answer says when its window resets, as here
            retry = 0.0 if allowed else (reset if cost <= per_unit or not per_unit else math.inf)
            remaining = max(per_unit - after, 0)
            statuses[i] = Decision(allowed, per_unit, remaining, reset, retry, limit.path)
            fallback = limit.path
            self.stats.record(limit.stats_key, fallback, per_unit, before, cost, limit.shadow)
        return verdict(limits, statuses, shadow_mode=self.shadow_mode)

    def _tiers(
        self, limits: list[EnvoyLimit | None], cost: int
    ) -> tuple[list[_Tier[L]], list[_Tier[L]], Decision | None]:
        """Counting the limits of a request at once: their own limiters."""
        enforced: list[_Tier[L]] = []
        shadow: list[_Tier[L]] = []
        blocked = None
        for limit in limits:
            if limit is None or limit.unlimited:
                continue
            if limit.blocked:
                if not limit.shadow and blocked is None:
                    # never passes; retry_after says when the window would reset
                    period = float(limit.period)
                    blocked = Decision(False, 0, 0, period, period, limit.path)
                continue
            item = (self._limit_limiter(limit), limit.key, cost)
            (shadow if limit.shadow else enforced).append(item)
        return enforced, shadow, blocked

    def _limit_limiter(self, limit: EnvoyLimit) -> L:
        rate = Rate(limit.requests_per_unit, limit.period)
        if not limit.override:
            limiter = self._limiters.get(limit.path)
            if limiter is None:
                limiter = self._limiters[limit.path] = self._limiter(rate, limit.path)
            return limiter
        slot = (limit.requests_per_unit, limit.period)
        limiter = self._overrides.get(slot)
        if limiter is None:
            limiter = self._overrides[slot] = self._limiter(rate, "envoy-override")
            if len(self._overrides) > MAX_OVERRIDE_LIMITERS:
                self._overrides.popitem(last=False)
        else:
            self._overrides.move_to_end(slot)
        return limiter

    def _tiered(
        self, matched: _Matched[L], told: tuple[Decision | None, Decision | None]
    ) -> EnvoyResult:
        """The answer of one atomic count (``matched.tiers``; None, None without). Its
        Decision is the one limit that spoke for the request: that limit's status
        and statistics are exact; the others are within their limit when the
        request passed, and uncounted when another limit denied it."""
        limits, cost, (decision, report) = matched.limits, matched.cost, told
        if matched.blocked is not None:
            return self._blocked(limits, matched.blocked, cost)
        statuses: list[Decision | None] = [None] * len(limits)
        ok = decision is None or decision.allowed
        spoke = False
        for i, limit in enumerate(limits):
            if limit is None or limit.unlimited:
                continue
            said = report if limit.shadow else decision
            name = "envoy-override" if limit.override else limit.path
            key, path, per_unit = limit.stats_key, limit.path, limit.requests_per_unit
            if said is not None and said.rule == name and not said.degraded and not spoke:
                spoke = not limit.shadow
                statuses[i] = said
                if said.allowed:
                    before = max(per_unit - said.remaining - cost, 0)
                    self.stats.record(key, path, per_unit, before, cost, limit.shadow)
                else:
                    self.stats.record_outcome(key, path, cost, "over", limit.shadow)
            else:
                outcome = "within" if ok else "uncounted"
                self.stats.record_outcome(key, path, cost, outcome, limit.shadow)
        return EnvoyResult(ok or self.shadow_mode, decision, limits, report, statuses)

    def _blocked(
        self, limits: list[EnvoyLimit | None], blocked: Decision, cost: int
    ) -> EnvoyResult:
        for limit in limits:
            if limit is not None and not limit.unlimited:
                outcome = "over" if limit.blocked else "uncounted"
                self.stats.record_outcome(limit.stats_key, limit.path, cost, outcome, limit.shadow)
        return EnvoyResult(self.shadow_mode, blocked, limits)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Loading makes some 30 containers a descriptor and frees none: each of
    the collector's passes over the growing heap finds nothing, and together
    they cost more than the loading itself (10,000 descriptors: 2.5 s, and
    0.7 s paused). What the load leaves behind is collected afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _cost(hits_addend: int) -> int:
    if type(hits_addend) is not int or hits_addend < 0:
        raise ConfigurationError(f"hits_addend must be an integer >= 0, got {hits_addend!r}")
    return max(hits_addend, 1)  # envoy treats 0 as 1


class EnvoyConfig(_EnvoyCore[Limiter, Store]):
    """envoyproxy/ratelimit configuration with its counters on ``store``;
    ``check(domain, descriptors, hits_addend, overrides)`` is what a gRPC
    ``ShouldRateLimit`` does. ``merge``: several files may name one domain
    (MERGE_DOMAIN_CONFIG); ``count_denied``: see the module docstring;
    ``shadow_mode``: every request passes, its limits counted all the same
    (SHADOW_MODE); ``quota_mode``: every limit is a quota (QUOTA_MODE);
    ``stats``: where the statistics go (a fresh `EnvoyStats` unless given)."""

    @classmethod
    def _fresh_store(cls) -> Store:
        return MemoryStore()

    def _limiter(self, rate: Rate, name: str) -> Limiter:
        return Limiter(rate, store=self.store, **self._counting(name))

    def check(
        self,
        domain: str,
        descriptors: Iterable[Sequence[tuple[str, str]]],
        hits_addend: int = 1,
        overrides: Sequence[Override | None] | None = None,
    ) -> EnvoyResult:
        matched = self._matched(domain, descriptors, hits_addend, overrides)
        if matched.calls is not None:
            return self._counted(matched, [c.hit(key, matched.cost) for c, key in matched.calls])
        return self._tiered(matched, hit_tiers(*matched.tiers) if matched.tiers else (None, None))


class AsyncEnvoyConfig(_EnvoyCore[AsyncLimiter, AsyncStore]):
    """The asyncio twin of `EnvoyConfig`: ``await config.acheck(...)``."""

    @classmethod
    def _fresh_store(cls) -> AsyncStore:
        return AsyncMemoryStore()

    def _limiter(self, rate: Rate, name: str) -> AsyncLimiter:
        return AsyncLimiter(rate, store=self.store, **self._counting(name))

    async def acheck(
        self,
        domain: str,
        descriptors: Iterable[Sequence[tuple[str, str]]],
        hits_addend: int = 1,
        overrides: Sequence[Override | None] | None = None,
    ) -> EnvoyResult:
        matched = self._matched(domain, descriptors, hits_addend, overrides)
        if matched.calls is not None:
            counting = (c.hit(key, matched.cost) for c, key in matched.calls)
            return self._counted(matched, await asyncio.gather(*counting))
        return self._tiered(
            matched, await ahit_tiers(*matched.tiers) if matched.tiers else (None, None)
        )

"""What a limit does when its store cannot decide: the policy and a circuit breaker.

Logic only, no I/O: the stores call these around their own I/O.

The ``local_fallback`` failure policy: while the store cannot decide, each process
enforces its part of the limit on its own.

Its part is the limit divided by the number of instances sharing the store (a count
given to the store, or a callable asked each time, such as a fleet's membership),
counted in a memory store of this process's own. Answers are marked degraded. When
the store answers again its own counts decide once more; the local ones are left to
expire.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec

from ..algorithms import Algorithm
from ..primitives import Clock, ConfigurationError, Decision, Rate, StoreError
from .base import BindOptions, Bound, OnFailure, pick

__all__ = [
    "POLICIES",
    "Breaker",
    "Instances",
    "LocalFallback",
    "OnFailure",
    "Share",
    "answer",
    "check_policy",
    "fallback",
]

POLICIES = ("raise", "fail_open", "fail_closed", "local_fallback")


def check_policy(policy: object) -> None:
    if policy not in POLICIES:
        raise ConfigurationError(f"on_failure must be one of {', '.join(POLICIES)}, got {policy!r}")


def fallback(
    policy: OnFailure, size: int, rule: str | None, retry_after: float, error: StoreError
) -> Decision:
    """The policy's answer when the store failed with ``error`` (raised again as it is
    under ``"raise"``, its cause kept). ``"local_fallback"`` here, where no
    local count is kept (the memory store's own limits), allows, as fail_open."""
    if policy in ("fail_open", "local_fallback"):
        return Decision(True, size, size, 0.0, 0.0, rule, True)
    if policy == "fail_closed":
        return Decision(False, size, 0, retry_after, retry_after, rule, True)
    raise error


class Breaker:
    """Stops paying the store's timeout on every call while it is down.

    Closed while calls succeed. After ``threshold`` failures in a row it opens for
    ``cooldown`` seconds: calls fail at once. Then one caller at a time probes the
    store; a success closes it, a failure opens it again. Racy by design (a second
    probe may slip through); it only ever trades a little latency, never a decision.
    """

    def __init__(
        self,
        *,
        threshold: int = 2,
        cooldown: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0  # in a row; the hot path reads only this
        self.open_until = 0.0
        self.probing = False
        self.probe_until = 0.0

    def allow(self) -> bool:
        """May this call go to the store? Only asked while ``failures`` is non-zero."""
        if self.failures < self.threshold:
            return True
        now = self.clock()
        # A probe that never reported (its caller was cancelled) stops counting as
        # one after a cooldown: the breaker must not stay open for good.
        if now < self.open_until or (self.probing and now < self.probe_until):
            return False
        self.probing = True
        self.probe_until = now + self.cooldown
        return True

    def succeeded(self) -> None:
        self.failures = 0
        self.probing = False

    def failed(self) -> None:
        self.failures += 1
        self.probing = False
        if self.failures >= self.threshold:
            self.open_until = self.clock() + self.cooldown

    def retry_after(self) -> float:
        """Seconds until the next probe may go out."""
        return max(self.open_until - self.clock(), 0.0) if self.failures else 0.0

    def __repr__(self) -> str:
        state = "closed" if self.failures < self.threshold else "open"
        return f"<Breaker {state}, {self.failures} failures in a row>"


Instances = int | Callable[[], int]
MAX_KEYS = 100_000  # per store: an outage must not grow memory without end


class LocalFallback:
    """The memory store a Redis store falls back on, and how many share the limits."""

    def __init__(self, instances: Instances, clock: Clock | None) -> None:
        if not callable(instances) and (type(instances) is not int or instances < 1):
            raise ConfigurationError(
                f"instances must be a positive integer or a callable, got {instances!r}"
            )
        from .memory import MemoryStore  # noqa: PLC0415 - the memory store imports this package

        self.instances = instances
        self.last = 1  # a callable's last good count
        self.store = MemoryStore(max_keys=MAX_KEYS, **({} if clock is None else {"clock": clock}))

    def count(self) -> int:
        """Instances sharing the limits now: a callable's answer; when it fails or
        answers anything but a positive integer (it may need the store that is
        down), its last good answer, or 1 (this process alone) if it never gave one."""
        if not callable(self.instances):
            return self.instances
        try:
            n = self.instances()
        except Exception:  # a failing count must not turn an outage into errors
            return self.last
        if type(n) is not int or n < 1:
            return self.last
        self.last = n
        return n

    def share(self, algorithm: Algorithm, rate: Rate, options: BindOptions) -> Share:
        return Share(self, algorithm, rate, options)


class Share:
    """One limit's local part, bound again whenever the number of instances moves."""

    def __init__(
        self, fallback: LocalFallback, algorithm: Algorithm, rate: Rate, options: BindOptions
    ) -> None:
        self.fallback, self.algorithm, self.rate, self.options = fallback, algorithm, rate, options
        self.bound: dict[int, Bound] = {}

    def get(self) -> Bound:
        n = self.fallback.count()
        bound = self.bound.get(n)
        if bound is None:
            rate, burst = self.rate, self.options["burst"]
            part = Rate(max(rate.limit // n, 1), rate.period)
            options = BindOptions(
                burst=None if burst is None else max(burst // n, 1),
                prefix=f"{self.options['prefix']}fallback/{n}:",
                rule=self.options["rule"],
                on_failure="raise",
            )
            bound = self.bound[n] = self.fallback.store.bind(self.algorithm, part, **options)
        return bound


class Tier(Protocol):
    """What a store's limit shows the policies (the exact and the two-tier ones)."""

    policy: OnFailure
    size: int
    rule: str | None
    local: Share | None


def answer(
    tiers: Sequence[Tier],
    checks: Sequence[tuple[str, int]],
    wait: float,
    error: StoreError,
    *,
    peek: bool = False,
) -> Decision:
    """The policies' answer for a request's ``tiers`` (each with its key and cost)
    when the store failed with ``error``: ``"raise"`` in any tier raises; the
    ``local_fallback`` tiers are counted here together, as one request."""
    decisions: list[Decision] = []
    local: list[tuple[Any, str, int]] = []
    bounds: list[Bound] = []
    store: Any = None
    for tier, (key, cost) in zip(tiers, checks, strict=True):
        if tier.policy == "local_fallback" and tier.local is not None:
            store = tier.local.fallback.store
            bound = tier.local.get()
            bounds.append(bound)
            local.append((bound.tier, key, cost))
        else:
            decisions.append(fallback(tier.policy, tier.size, tier.rule, wait, error))
    if local:
        if peek:
            here = pick(
                [b.peek(key, cost) for b, (_, key, cost) in zip(bounds, local, strict=True)]
            )
        elif len(local) == 1:
            here = bounds[0].hit(local[0][1], local[0][2])
        else:
            here = store.hit_many(local)
        decisions.append(msgspec.structs.replace(here, degraded=True))
    return pick(decisions)

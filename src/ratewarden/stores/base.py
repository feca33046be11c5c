"""The store protocol: what `Limiter`, `hit_many` and the rule engine ask of a
store, complete enough to write one outside this package (docs/stores.md shows
one). A store keeps the algorithms' states and applies their steps atomically;
`MemoryStore` and the Redis stores are written against this protocol too.

A sync store (`Store`) offers::

    clock                                 a `Clock`: limiters wait on it, engines read it
    bind(algorithm, rate, **BindOptions)  -> Bound, once per limit a limiter binds
    hit_many(checks)                      -> Decision: all tiers counted, or none
    hit_tiers(checks, shadow)             -> Answers: hit_many of each side, in one go
    close()                               lets go of what the store holds

`AsyncStore` is its twin: ``hit_many`` and ``hit_tiers`` (and the `AsyncBound`'s
functions) return awaitables, ``aclose()`` replaces ``close()``, ``bind`` stays
plain. The two protocols differ in their return types, so a type checker
rejects an async store in a sync `Limiter` and the reverse.

``bind(algorithm, rate, *, burst, prefix, rule, on_failure, two_tier=False)``
    ``algorithm.step`` is the pure step function every store must agree with
    (`ratewarden.algorithms`); ``Params.build(rate.limit, rate.period_ns,
    burst=burst, tick=1e-9, rule=rule)`` compiles the limit for nanosecond
    ticks. ``prefix`` names the limit: binds with one prefix are the same limit
    and share counters (a reloaded rule, a second limiter with the same name),
    binds with different prefixes never meet. ``rule`` is what the Decisions
    carry as ``rule``. ``on_failure`` is the limit's `OnFailure` policy for when
    the store cannot decide (see below). ``two_tier`` asks to count in the
    process and sync now and then; a store that is local already ignores it.
    Returns a `Bound`:

    - ``hit(key, cost=1) -> Decision``: counts ``cost`` against ``key`` if it
      fits, atomically; a denied hit counts nothing;
    - ``peek(key, cost=1) -> Decision``: what that hit would be told, counting
      nothing (`ratewarden.algorithms.peek` derives it from the step);
    - ``reset(key) -> None``: forgets the key;
    - ``tier``: any object of the store's; the store gets it back in `Check`\\ s.

``hit_many(checks)`` with ``checks`` a sequence of `Check`, ``(tier, key,
cost)``, each tier from a ``bind`` of this same store
    Admits the request only if every tier passes, and then counts it in all of
    them; a denied request is counted in none. A key that appears in two checks
    steps twice, the second time from the state the first left. Returns
    `pick` of the tiers' Decisions.

``hit_tiers(checks, shadow)`` for the rule engine
    ``hit_many(checks)`` and then, if that admitted the request (or ``checks``
    is empty), ``hit_many(shadow)``: the shadow tiers are counted but never
    deny. Returns `Answers`, ``(checks' Decision, shadow's Decision)``, None
    for a side that is empty or was not checked. One atomic step where the
    store can; nothing else may count between the two sides.

``close()`` / ``aclose()``
    Whoever made the store closes it: a limiter never does, since many
    limiters share a store. The server calls ``aclose`` when it stops.
    `MemoryStore`'s does nothing.

Rules every method keeps:

- costs: `check_cost` rejects anything but a positive ``int`` with
  `ConfigurationError`; a cost larger than the limit can ever grant is a denial
  with ``retry_after=inf`` (the step functions answer so), never an error;
- time: read from ``clock`` (or from a server's clock, as Redis's), in integer
  nanoseconds since the epoch, so a `FakeClock` drives a store exactly in tests;
- threads: a sync store is called from many threads at once, an async one from
  many tasks; each hit must be atomic under both;
- failure: over the limit is a Decision, never an exception. When the store
  cannot decide (its server is down) it raises a `StoreError`
  (`StoreUnavailable`, the backend's error as its ``__cause__``) under
  ``on_failure="raise"``, and otherwise answers what `fallback` says for the
  limit's policy; a store that cannot fail ignores ``on_failure``.

One name is taken: the rule engine and the server read an attribute named
``client`` as a Redis client, and keep runtime overrides there. A store that is
not a Redis store has no attribute of that name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Literal, NamedTuple, NotRequired, Protocol, TypeAlias, TypedDict, Unpack

from ..algorithms import Algorithm
from ..algorithms.calendar import Calendar
from ..primitives import Clock, ConfigurationError, Decision, Rate

__all__ = [
    "Answers",
    "AsyncBound",
    "AsyncHitFn",
    "AsyncResetFn",
    "AsyncStore",
    "BindOptions",
    "Bound",
    "Check",
    "HitFn",
    "OnFailure",
    "ResetFn",
    "Store",
    "check_cost",
    "pick",
]

# One tier of a multi-tier check: the tier handle a store's `bind` returned (what it
# is belongs to that store), the key, the cost.
Check: TypeAlias = tuple[Any, str, int]

# What `hit_tiers` answers: the enforced tiers' Decision, then the shadow tiers';
# None for a side that was empty or not checked.
Answers: TypeAlias = tuple[Decision | None, Decision | None]


def check_cost(cost: object) -> None:
    """Every store's check of a request's cost: a positive integer."""
    if type(cost) is not int or cost < 1:
        raise ConfigurationError(f"cost must be a positive integer, got {cost!r}")


def pick(decisions: Sequence[Decision]) -> Decision:
    """The one Decision that speaks for a multi-tier check. Denied: the denying tier
    with the longest retry_after, since the request passes only once every tier does
    (and a tier that passes at some time passes at every later one, absent other
    traffic). Allowed: the tier with the least room left relative to its size, the
    one a client should pace itself by. Ties go to the earlier tier."""
    chosen = decisions[0]
    for decision in decisions[1:]:
        if chosen.allowed:
            if not decision.allowed or (
                decision.remaining * chosen.limit < chosen.remaining * decision.limit
            ):
                chosen = decision
        elif not decision.allowed and decision.retry_after > chosen.retry_after:
            chosen = decision
    return chosen


# What a limit does when its store cannot decide: raise `StoreUnavailable`, allow,
# deny, or count in this process against its share of the limit (`fallback` gives
# each policy's Decision; `ratewarden.stores.failure` keeps the local counts).
OnFailure = Literal["raise", "fail_open", "fail_closed", "local_fallback"]


class BindOptions(TypedDict):
    """How a limit is bound to a store, beyond its algorithm and rate."""

    burst: int | None  # bucket capacity; None: the rate's limit
    prefix: str  # prepended to every key, so limits sharing a store keep apart
    rule: str | None  # the name Decisions carry
    on_failure: OnFailure  # what to answer when the store cannot decide
    # count locally and sync (the Redis stores; the memory store is local already)
    two_tier: NotRequired[bool]
    # fixed windows on a time zone's calendar (the memory and Redis stores)
    calendar: NotRequired[Calendar]


class HitFn(Protocol):
    """`Bound.hit` and `Bound.peek`; callers pass ``cost`` by position or by name."""

    def __call__(self, key: str, cost: int = 1) -> Decision: ...


class ResetFn(Protocol):
    """`Bound.reset`: forget ``key``."""

    def __call__(self, key: str) -> None: ...


class AsyncHitFn(Protocol):
    """`AsyncBound.hit` and `AsyncBound.peek`, awaited."""

    def __call__(self, key: str, cost: int = 1) -> Awaitable[Decision]: ...


class AsyncResetFn(Protocol):
    """`AsyncBound.reset`, awaited."""

    def __call__(self, key: str) -> Awaitable[None]: ...


class Bound(NamedTuple):
    """One limit bound to a store: the functions a `Limiter` calls per request, and
    the handle that names the limit in the store's ``hit_many``."""

    hit: HitFn
    peek: HitFn
    reset: ResetFn
    tier: Any


class AsyncBound(NamedTuple):
    """`Bound` for an `AsyncStore`: the same four, the functions awaited."""

    hit: AsyncHitFn
    peek: AsyncHitFn
    reset: AsyncResetFn
    tier: Any


class Store(Protocol):
    """A synchronous store. Distinct from `AsyncStore`, so a type checker rejects an
    async store in a sync `Limiter` and the reverse."""

    clock: Clock

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound: ...

    def hit_many(self, checks: Sequence[Check]) -> Decision:
        """Every tier passes and is counted, or none is counted (see `pick`)."""
        ...

    def hit_tiers(self, checks: Sequence[Check], shadow: Sequence[Check]) -> Answers:
        """``hit_many(checks)``, then, if it passed, ``hit_many(shadow)`` (tiers
        that never deny), in one go; None for a side not checked."""
        ...

    def close(self) -> None:
        """Let go of connections and threads; whoever made the store calls it when
        done with it."""
        ...


class AsyncStore(Protocol):
    """An asyncio store: `Store`'s twin (see the module docstring)."""

    clock: Clock

    def bind(
        self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]
    ) -> AsyncBound: ...

    def hit_many(self, checks: Sequence[Check]) -> Awaitable[Decision]: ...

    def hit_tiers(self, checks: Sequence[Check], shadow: Sequence[Check]) -> Awaitable[Answers]: ...

    def aclose(self) -> Awaitable[None]: ...

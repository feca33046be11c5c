"""`LimiterConfig`: a limiter's options, checked once and made into what its
store binds (the algorithm, the key prefix, shards, an adaptive price, a
calendar, learned estimates). No I/O; `Limiter` and `AsyncLimiter` hold one each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from ._adaptive import UNITS, Adaptive, Scale
from ._clock import Clock
from ._errors import ConfigurationError
from ._rate import Rate, parse_rate
from ._reservation import Estimates, Learned
from .algorithms import Algorithm, Refill, get_algorithm
from .algorithms.calendar import Calendar, calendar_unit
from .stores import AsyncStore, Store
from .stores import shards as _shards
from .stores.base import AsyncBound, BindOptions, Bound
from .stores.failure import OnFailure, check_policy

__all__ = ["DEFAULT_ALGORITHM", "LimiterConfig", "LimiterOptions"]

DEFAULT_ALGORITHM = "sliding_window_counter"


class LimiterOptions(TypedDict, total=False):
    """The options `Limiter` and `AsyncLimiter` share (see `Limiter`)."""

    algorithm: str
    burst: int | None
    refill: Refill
    name: str | None
    on_failure: OnFailure
    two_tier: bool
    shards: int
    promote_at: float | None
    classes: Sequence[str]
    adaptive: Adaptive | None
    calendar: str | None
    week_start: str
    estimates: Estimates | None


@dataclass(frozen=True, slots=True)
class LimiterConfig:
    rate: Rate
    algorithm: Algorithm
    options: BindOptions
    shards: int = 1
    promote_at: float | None = None
    classes: tuple[str, ...] = ()
    adaptive: Adaptive | None = None
    # what the store counts: the rate itself, or in units when adaptive (see _adaptive)
    counted: Rate | None = None
    calendar: Calendar | None = None  # windows on a time zone's calendar
    learned: Learned | None = None  # what reserve(profile=...) learns, with estimates=

    @classmethod
    def make(
        cls,
        rate: str | Rate,
        *,
        algorithm: str | None = None,
        burst: int | None = None,
        refill: Refill = "continuous",
        name: str | None = None,
        on_failure: OnFailure = "raise",
        two_tier: bool = False,
        shards: int = 1,
        promote_at: float | None = None,
        classes: Sequence[str] = (),
        adaptive: Adaptive | None = None,
        calendar: str | None = None,
        week_start: str = "monday",
        estimates: Estimates | None = None,
    ) -> LimiterConfig:
        parsed = parse_rate(rate)
        cal = None
        if calendar is not None:
            if adaptive is not None or two_tier or shards != 1:
                raise ConfigurationError(
                    "a calendar limit is a plain fixed window (on the memory or a Redis store):"
                    " no adaptive, two_tier or shards"
                )
            cal = _calendar(parsed, calendar, week_start, algorithm)
            algorithm = "fixed_window"
        elif week_start != "monday":
            raise ConfigurationError("week_start goes with a calendar: calendar='Europe/Berlin'")
        if algorithm is None:
            algorithm = DEFAULT_ALGORITHM
        named: tuple[object, ...] = () if isinstance(classes, str) else tuple(classes)
        if (
            isinstance(classes, str)
            or not all(isinstance(c, str) and c for c in named)
            or len(set(named)) != len(named)
        ):
            raise ConfigurationError(
                f"classes is a list of distinct class names, highest first, got {classes!r}"
            )
        algo = get_algorithm(algorithm, refill=refill)
        if cal is not None:  # the fixed window, on the calendar's edges
            algo = Algorithm(algo.name, cal.step, uses_burst=False)
        if burst is not None:
            if not algo.uses_burst:
                raise ConfigurationError(
                    f"burst applies to token_bucket, leaky_bucket and gcra, not {algorithm!r}"
                )
            if type(burst) is not int or burst < 1:
                raise ConfigurationError(f"burst must be a positive integer, got {burst!r}")
        check_policy(on_failure)
        if name is not None and (not isinstance(name, str) or not name):  # type: ignore[redundant-expr]
            raise ConfigurationError(f"name must be a non-empty string, got {name!r}")
        # Limiters sharing a store keep apart unless they are the same limit: the key
        # prefix names the limit, after the limiter's name if it has one. So two
        # limiters with one name and one limit share counters (a rule reloaded
        # unchanged keeps them), and a name whose limit changed starts afresh rather
        # than reading another algorithm's state.
        # A name "x@<this limit's rate>" (the rule engine's name for one rate of a rule
        # with several) counts as "x": the tag says the rate already, and so a rule
        # that gains or loses a rate keeps the counters of the rates it had.
        mode = "" if refill == "continuous" else f"/{refill}"
        tag = f"{algo.name}{mode}/{parsed}" + ("" if burst is None else f"/burst={burst}")
        if cal is not None:
            tag += f"/{cal.tag}"
        counted = parsed
        if adaptive is not None:
            if not isinstance(adaptive, Adaptive):
                raise ConfigurationError(f"adaptive takes Adaptive(...), got {adaptive!r}")
            if algo.name == "sliding_window_log":
                raise ConfigurationError(
                    "an adaptive limit counts in units, and sliding_window_log keeps one entry"
                    " per unit: use sliding_window_counter, fixed_window or a bucket"
                )
            # counted in units: a key prefix of its own, so units never meet requests
            counted = Rate(parsed.limit * UNITS, parsed.period)
            tag += f"/units={UNITS}"
        owner = name
        if name is not None and name.endswith(f"@{parsed}") and len(name) > len(f"@{parsed}"):
            owner = name[: -len(f"@{parsed}")]
        prefix = f"{tag}:" if owner is None else f"{owner}:{tag}:"
        counted_burst = burst if burst is None or adaptive is None else burst * UNITS
        options = BindOptions(burst=counted_burst, prefix=prefix, rule=name, on_failure=on_failure)
        if two_tier:
            if type(two_tier) is not bool:
                raise ConfigurationError(f"two_tier must be True or False, got {two_tier!r}")
            options["two_tier"] = True
        if cal is not None:
            options["calendar"] = cal
        _shards.check_shards(shards, promote_at)
        return cls(
            parsed,
            algo,
            options,
            shards,
            promote_at,
            tuple(map(str, named)),
            adaptive,
            counted,
            cal,
            None if estimates is None else Learned(estimates),
        )

    @property
    def units(self) -> int:
        """The limit in units as the store counts it: the bucket's capacity or the
        window's limit (an adaptive limit's price never goes past it)."""
        counted = self.counted or self.rate
        burst = self.options["burst"]
        return counted.limit if burst is None else burst

    def tier_parts(self) -> tuple[tuple[int, int], bool]:
        """What `Limiter.tier` tells of every tier, made once: the limits in
        units (whole and per shard), and whether it is sharded."""
        units = self.units
        return (units, units // self.shards), self.shards > 1

    def scale(self, clock: Clock) -> Scale | None:
        """An adaptive limit's price, read on ``clock``; None for a plain limit."""
        if self.adaptive is None:
            return None
        return Scale(self.adaptive, clock, self.units)

    def bind(self, store: Store) -> Bound:
        self._check_store(store)
        rate = self.counted or self.rate
        if self.shards == 1:
            return store.bind(self.algorithm, rate, **self.options)
        return _shards.bind(store, self.algorithm, rate, self.options,
                            shards=self.shards, promote_at=self.promote_at)  # fmt: skip

    def abind(self, store: AsyncStore) -> AsyncBound:
        self._check_store(store)
        rate = self.counted or self.rate
        if self.shards == 1:
            return store.bind(self.algorithm, rate, **self.options)
        return _shards.abind(store, self.algorithm, rate, self.options,
                             shards=self.shards, promote_at=self.promote_at)  # fmt: skip

    def _check_store(self, store: object) -> None:
        """A store counts a calendar's periods only if it says so (the memory and
        Redis stores): another would count a '/month' as 30 days from the epoch."""
        if self.calendar is not None and getattr(store, "calendars", False) is not True:
            raise ConfigurationError(
                f"a calendar limit ({self.rate}, {self.calendar.tz}) counts on the memory"
                f" or a Redis store; {type(store).__name__} does not count calendar periods"
            )


def _calendar(rate: Rate, tz: str, week_start: str, algorithm: str | None) -> Calendar:
    """The calendar of a limit, or why it cannot have one."""
    if algorithm not in (None, "fixed_window"):
        raise ConfigurationError(
            f"a calendar limit counts in fixed windows (its periods), not {algorithm}:"
            " leave algorithm out, or give fixed_window"
        )
    return Calendar(tz, calendar_unit(rate.period), week_start)

"""The limit a request meets now: an override's rate in the engine's limits, and
an adaptive limit's effective size (see `ratewarden._adaptive`): the `Adaptive`
a rule's limit gets, reading a named signal of the engine, and the limit a
request is shown, in requests. No I/O.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ..kernel import UNITS, Adaptive, LoadSignals
from ..primitives import Rate
from ._compile import Applicable, LimitSpec

__all__ = ["adaptive_of", "effective_spec", "in_force"]


def adaptive_of(spec: LimitSpec, signals: LoadSignals) -> Adaptive | None:
    """The `Adaptive` of a rule's limit: its settings, reading the engine's signal."""
    settings = spec.adaptive
    if settings is None:
        return None
    return Adaptive(
        signals.reader(settings.signal), good=settings.good, bad=settings.bad,
        floor=settings.floor, interval=settings.interval, smoothing=settings.smoothing,
        dead_band=settings.dead_band,
    )  # fmt: skip


@functools.lru_cache(maxsize=4096)  # a few limits, each at a few prices at a time
def effective_spec(spec: LimitSpec, price: int) -> LimitSpec:
    """``spec`` as a request sees it at ``price`` units a request: its rate's
    limit and its burst in requests, as its Decisions tell them (never below 1)."""
    if price == UNITS:
        return spec
    limit = max(1, spec.rate.limit * UNITS // price)
    burst = None if spec.burst is None else max(1, spec.burst * UNITS // price)
    return dataclasses.replace(spec, rate=Rate(limit, spec.rate.period), burst=burst)


def in_force(applicable: Applicable, specs: tuple[LimitSpec, ...], limiters: Any) -> Applicable:
    """The limit a request meets now: an override's rate, and an adaptive limit's
    effective size (the price read here is the one the store call charges, unless
    the signal's interval ends in between)."""
    slot = applicable.slot
    spec = specs[slot]
    scale = limiters[slot].scale
    if scale is not None:
        price = scale.unit()
        shown = scale.shown  # (price, spec, effective spec): hashing a spec costs more
        if shown is None or shown[0] != price or shown[1] is not spec:
            shown = scale.shown = (price, spec, effective_spec(spec, price))
        spec = shown[2]
    if spec is applicable.limit:  # the full limit, no override: as the rule set has it
        return applicable
    return Applicable(applicable.rule, slot, applicable.key, applicable.cost, spec)

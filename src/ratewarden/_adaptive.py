"""Adaptive limits: a limit scaled by a load signal the application feeds.

The effective limit is a price, not a new limit. An adaptive limiter counts in
units, ``UNITS`` to a request at the full limit (its store holds ``limit x UNITS``
units a window), and a request costs about ``UNITS / factor`` units, where the
factor runs from 1 (load good) down to the floor (load bad); the price is
rounded so that the limit admits ``factor`` times its requests, rounded down.
So:

- the stores, their Lua scripts, two-tier counting and sharding need nothing new:
  a price is a cost, and every store counts costs exactly;
- what a key has used so far applies at once at a new price: no reset, no new
  key prefix, no window to wait for, whichever way the load moves;
- a Decision is turned back into requests (`in_requests`) before anyone sees
  it, so ``limit`` and ``remaining`` (and every header made from them) say the
  effective limit, never units.

``sliding_window_log`` stores one entry per unit, so it cannot be adaptive.

The signal is read at most once per ``interval`` (never per request), smoothed
by an exponential moving average, and the factor moves only when the smoothed
value asks for a change larger than ``dead_band``: a noisy signal does not make
the limit flicker. Values between ``good`` and ``bad`` map linearly onto 1 ..
``floor``; ``good`` may be above ``bad`` (a signal where more is better).

`LoadSignals` holds the named signals a rule file's ``adaptive:`` reads: values
set by the application (or the service's ``PUT /v1/load/{signal}``), or
callables; each process has its own (the load is the load of this process's
work: its latency, its queue).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._clock import Clock
from ._decision import Decision
from ._errors import ConfigurationError

__all__ = ["UNITS", "Adaptive", "LoadSignals", "Scale", "in_requests", "parse_floor"]

log = logging.getLogger("ratewarden.adaptive")

UNITS = 1000  # units of a request at the full limit: the factor's resolution is 0.1%
MAX_SIGNALS = 1000  # named signals one `LoadSignals` holds at most

Load = Callable[[], "float | None"]


def _number(name: str, value: object) -> float:
    if type(value) is bool or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def parse_floor(value: object) -> float:
    """A floor as a fraction of the limit: ``0.1`` or ``"10%"``, > 0 and <= 1."""
    text = value.strip() if isinstance(value, str) else None
    if text is not None and text.endswith("%"):
        try:
            fraction = float(text[:-1]) / 100
        except ValueError:
            fraction = math.nan
    elif text is not None:
        fraction = math.nan
    else:
        fraction = _number("floor", value) if not isinstance(value, bool) else math.nan
    if not (math.isfinite(fraction) and 0 < fraction <= 1):
        raise ConfigurationError(
            f"floor is a share of the limit, > 0 and <= 1 (0.1 or '10%'), got {value!r}"
        )
    return fraction


@dataclass(frozen=True, slots=True)
class Adaptive:
    """How a limit follows a load signal.

    ``load``        a callable returning the signal's value (None: no value yet,
                    the factor stays as it is);
    ``good``        at or past this value, the full limit;
    ``bad``         at or past this value, ``floor`` times the limit;
    ``floor``       the least share of the limit, > 0 and <= 1 (``"10%"`` or 0.1);
                    never less than one request, however small the limit;
    ``interval``    seconds between two reads of ``load`` (on the store's clock);
    ``smoothing``   the weight of a new reading in the moving average, > 0 and
                    <= 1 (1: no smoothing);
    ``dead_band``   the least change of the factor acted on (0.05: 5% of the
                    limit); the factor still reaches 1 and the floor exactly.
    """

    load: Load
    good: float
    bad: float
    floor: float | str = 0.1
    interval: float = 1.0
    smoothing: float = 0.3
    dead_band: float = 0.05

    def __post_init__(self) -> None:
        if not callable(self.load):
            raise ConfigurationError(f"load must be a callable, got {self.load!r}")
        good, bad = _number("good", self.good), _number("bad", self.bad)
        if good == bad:
            raise ConfigurationError(f"good and bad must differ, both are {good!r}")
        parse_floor(self.floor)
        interval = _number("interval", self.interval)
        if not 0 < interval <= 3600:
            raise ConfigurationError(f"interval is seconds, > 0 and <= 3600, got {interval!r}")
        smoothing = _number("smoothing", self.smoothing)
        if not 0 < smoothing <= 1:
            raise ConfigurationError(f"smoothing must be > 0 and <= 1, got {smoothing!r}")
        dead_band = _number("dead_band", self.dead_band)
        if not 0 <= dead_band < 1:
            raise ConfigurationError(f"dead_band must be >= 0 and < 1, got {dead_band!r}")

    def factor_of(self, value: float) -> float:
        """The share of the limit a (smoothed) value asks for, from 1 to the floor."""
        floor = parse_floor(self.floor)
        share = (value - self.good) / (self.bad - self.good)  # 0 at good, 1 at bad
        return 1.0 - min(1.0, max(0.0, share)) * (1.0 - floor)


def price(factor: float, most: int) -> int:
    """Units a request costs at ``factor`` under a limit of ``most`` units: the
    price at which the limit admits ``factor`` times its requests, rounded down
    to whole requests and never below one (10 at 0.6 admits 6, not the 5 that
    ``ceil(UNITS / 0.6)`` would leave)."""
    requests = max(1, math.floor(round(most * factor / UNITS, 6)))
    return max(1, most // requests)


def in_requests(decision: Decision, unit: int) -> Decision:
    """A Decision counted in units, told in requests of ``unit`` units each."""
    return Decision(
        decision.allowed, decision.limit // unit, max(decision.remaining, 0) // unit,
        decision.reset_after, decision.retry_after, decision.rule, decision.degraded,
    )  # fmt: skip


class Scale:
    """An `Adaptive` at work for one limiter: the factor now and the price of a
    request. ``unit()`` is the hot path: one clock read and a comparison, and a
    read of the signal once per interval by whichever caller comes first (the
    others go on at the old price rather than wait for it)."""

    __slots__ = ("_lock", "_next_ns", "_period_ns", "adaptive", "clock", "factor", "most",
                 "price", "reads", "shown", "smoothed")  # fmt: skip

    def __init__(self, adaptive: Adaptive, clock: Clock, most: int) -> None:
        self.adaptive = adaptive
        self.clock = clock
        self.most = most  # the limit in units: a request never costs more than all of it
        self.factor = 1.0
        self.price = UNITS
        self.smoothed: float | None = None
        self.reads = 0
        self.shown: Any = None  # the rule engine's effective limit at this price, cached
        self._period_ns = round(adaptive.interval * 1e9)
        self._next_ns = 0
        self._lock = threading.Lock()

    def unit(self) -> int:
        """What a request costs now, in units."""
        now = self.clock.time_ns()
        if now >= self._next_ns and self._lock.acquire(blocking=False):
            try:
                self._next_ns = now + self._period_ns
                self._read()
            finally:
                self._lock.release()
        return self.price

    def limit(self, units: int) -> int:
        """A limit of ``units`` units, in requests at the current price."""
        return units // self.price

    def _read(self) -> None:
        adaptive = self.adaptive
        self.reads += 1
        try:
            raw = adaptive.load()
        except Exception as exc:  # the application's callable: any failure keeps the price
            log.warning("load signal %r failed, the limit stays as it is: %r", adaptive.load, exc)
            return
        if raw is None:
            return
        if type(raw) is bool or not isinstance(raw, int | float) or not math.isfinite(raw):  # type: ignore[redundant-expr]
            log.warning("load signal %r gave %r, not a finite number: the limit stays as it is",
                        adaptive.load, raw)  # fmt: skip
            return
        value = float(raw)
        smoothed = self.smoothed
        smoothed = value if smoothed is None else smoothed + adaptive.smoothing * (value - smoothed)
        self.smoothed = smoothed
        target = adaptive.factor_of(smoothed)
        floor = parse_floor(adaptive.floor)
        extreme = target in (1.0, floor)
        if target != self.factor and (extreme or abs(target - self.factor) >= adaptive.dead_band):
            self.factor = target
            self.price = price(target, self.most)

    def __repr__(self) -> str:
        return f"<Scale factor={self.factor:.3f} price={self.price} smoothed={self.smoothed!r}>"


class LoadSignals:
    """Named load signals of one engine: each a value set with `set` or a
    callable. `reader` gives the callable an `Adaptive` reads. Bounded: at most
    `MAX_SIGNALS` names, and only the ones ``known`` (those the rules read)
    when the engine says which."""

    def __init__(self) -> None:
        self._values: dict[str, float | Load] = {}
        self.known: frozenset[str] | None = None

    def set(self, name: str, value: float | Load) -> None:
        """Feed ``name`` a value (a finite number) or a callable read in its place."""
        if not isinstance(name, str) or not name:  # type: ignore[redundant-expr]
            raise ConfigurationError(f"a signal name is a non-empty string, got {name!r}")
        if self.known is not None and name not in self.known:
            listed = ", ".join(sorted(self.known)) or "none"
            raise ConfigurationError(
                f"no rule reads the signal {name!r} (the rules read: {listed})"
            )
        if not callable(value):
            value = _number(f"the value of {name!r}", value)
        if name not in self._values and len(self._values) >= MAX_SIGNALS:
            raise ConfigurationError(f"at most {MAX_SIGNALS} load signals")
        self._values[name] = value

    def get(self, name: str) -> float | None:
        """The signal's value now (a callable is called); None if never set."""
        value = self._values.get(name)
        return value() if callable(value) else value

    def values(self) -> dict[str, float | None]:
        """Every signal set, as its value now (for reports)."""
        out: dict[str, float | None] = {}
        for name in sorted(self._values):
            try:
                out[name] = self.get(name)
            except Exception:  # an application's callable: a report says "no value"
                out[name] = None
        return out

    def reader(self, name: str) -> Load:
        def read() -> float | None:
            return self.get(name)

        read.__qualname__ = f"signal {name!r}"
        return read

    def __repr__(self) -> str:
        return f"<LoadSignals {sorted(self._values)}>"

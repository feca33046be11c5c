"""A fleet quota's configuration: validated here, stored in Redis as a hash.

The coordinator reads its fields (``total``, ``window_ms``, ``algorithm``,
``refresh_ms``, ``lease_ms``, ``safe``, ``cap_m``, ``adaptive``, ``floor_m``);
it adds its own (``eff_m`` the effective total, ``version``, ``seq`` and the
adaptive total's timestamps).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from ..primitives import ConfigurationError, Rate, parse_rate
from .alloc import ALLOCATORS, MILLI

__all__ = ["QuotaConfig", "check_name"]

_NAME = re.compile(r"[A-Za-z0-9._:/-]{1,200}")
MAX_TOTAL = 10**12  # permits a window: millipermits stay exact in Lua's doubles


def check_name(name: object) -> str:
    """A resource name: it sits inside the keys' hash tag and the channel name,
    so no braces, spaces or control characters."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"a quota name is 1-200 characters of letters, digits and . _ : / -, got {name!r}"
        )
    return name


def _seconds(what: str, value: object, *, least: float) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(f"{what} must be a number of seconds, got {value!r}")
    ms = round(value * 1000)
    if ms < least * 1000:
        raise ConfigurationError(f"{what} must be at least {least} s, got {value!r}")
    return ms


@dataclass(frozen=True, init=False)
class QuotaConfig:
    """How one resource's limit is shared.

    ``rate``: the provider's limit for the whole fleet (``"2000/second"``): its
    count is the total of whole permits per window, its period the window,
    aligned to the epoch. ``algorithm``: ``equal``, ``proportional_share``,
    ``fair_share`` or ``static`` (each member what it wants up to ``cap``
    permits a window). ``refresh``: seconds between a member's reports
    (jittered by up to 10%); ``lease``: seconds a member's share outlives its
    last report (a dead member's share is free again after it). ``safe``: the
    share a member falls back to when its lease ran out without reaching Redis:
    ``"equal"`` (the total over the membership), ``0``, or a number of permits a
    window; the coordinator keeps the members' safe shares within the total.
    ``adaptive``: lower the total when the provider refuses members that kept
    their shares, raise it back additively up to ``rate``, never below ``floor``
    permits a window. ``sliding``: for a provider that counts any rolling
    window, not aligned ones: no stretch of one window, wherever it starts, sees
    more than the total from the fleet (paced, permits spaced evenly, space that
    moves between members taken up a window after it was given up), at a cost in
    utilisation (docs/fleet.md).
    """

    rate: Rate
    algorithm: str = "fair_share"
    refresh: float = 1.0
    lease: float = 5.0
    safe: str | int = "equal"
    cap: int = 0
    adaptive: bool = False
    floor: int = 1
    sliding: bool = False

    def __init__(
        self,
        rate: str | Rate,
        algorithm: str = "fair_share",
        *,
        refresh: float = 1.0,
        lease: float = 5.0,
        safe: str | int = "equal",
        cap: int = 0,
        adaptive: bool = False,
        floor: int = 1,
        sliding: bool = False,
    ) -> None:
        values = {
            "rate": parse_rate(rate),
            "algorithm": algorithm,
            "refresh": refresh,
            "lease": lease,
            "safe": safe,
            "cap": cap,
            "adaptive": adaptive,
            "floor": floor,
            "sliding": sliding,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self._check()

    def _check(self) -> None:
        if self.rate.limit > MAX_TOTAL:
            raise ConfigurationError(f"a quota's total is at most {MAX_TOTAL} a window")
        if self.rate.period_ns < 10_000_000 or self.rate.period_ns % 1_000_000:
            raise ConfigurationError(
                f"a quota's window is a whole number of milliseconds, at least 10, got {self.rate}"
            )
        if self.algorithm not in ALLOCATORS:
            raise ConfigurationError(
                f"unknown algorithm {self.algorithm!r}; expected one of {', '.join(ALLOCATORS)}"
                + _guess(str(self.algorithm), ALLOCATORS)
            )
        refresh = _seconds("refresh", self.refresh, least=0.01)
        lease = _seconds("lease", self.lease, least=0.02)
        if lease < 2 * refresh:
            raise ConfigurationError(
                f"lease ({self.lease} s) must be at least twice refresh ({self.refresh} s):"
                " a member that misses one report must not lose its share"
            )
        if self.safe != "equal" and (
            isinstance(self.safe, bool) or not isinstance(self.safe, int) or self.safe < 0
        ):
            raise ConfigurationError(
                f"safe must be 'equal' or a number of permits >= 0, got {self.safe!r}"
            )
        for name in ("cap", "floor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"{name} must be a whole number >= 0, got {value!r}")
        if self.algorithm == "static" and self.cap <= 0:
            raise ConfigurationError("the static algorithm needs cap, the permits per member")
        if not isinstance(self.adaptive, bool):
            raise ConfigurationError(f"adaptive must be true or false, got {self.adaptive!r}")
        if not isinstance(self.sliding, bool):
            raise ConfigurationError(f"sliding must be true or false, got {self.sliding!r}")

    @property
    def window_ns(self) -> int:
        return self.rate.period_ns

    def fields(self) -> dict[str, str]:
        """The hash the coordinator keeps."""
        return {
            "total": str(self.rate.limit),
            "window_ms": str(round(self.rate.period * 1000)),
            "algorithm": self.algorithm,
            "refresh_ms": str(round(self.refresh * 1000)),
            "lease_ms": str(round(self.lease * 1000)),
            "safe": str(self.safe),
            "cap_m": str(self.cap * MILLI),
            "adaptive": "1" if self.adaptive else "0",
            "floor_m": str(min(self.floor, self.rate.limit) * MILLI),
            "sliding": "1" if self.sliding else "0",
        }

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> QuotaConfig:
        """Read back what `fields` wrote (ConfigurationError if it is not that)."""
        try:
            safe: str | int = fields.get("safe", "equal")
            if safe != "equal":
                safe = int(safe)
            window = int(fields["window_ms"]) / 1000
            return cls(
                rate=Rate(int(fields["total"]), window),
                algorithm=fields.get("algorithm", "fair_share"),
                refresh=int(fields.get("refresh_ms", "1000")) / 1000,
                lease=int(fields.get("lease_ms", "5000")) / 1000,
                safe=safe,
                cap=int(fields.get("cap_m", "0")) // MILLI,
                adaptive=fields.get("adaptive") == "1",
                floor=int(fields.get("floor_m", "1000")) // MILLI,
                sliding=fields.get("sliding") == "1",
            )
        except (KeyError, ValueError) as exc:
            raise ConfigurationError(f"unreadable quota configuration {fields!r}: {exc}") from exc

    def describe(self) -> str:
        """One line for logs: rate, algorithm and the settings that differ from the defaults."""
        parts = [str(self.rate), self.algorithm]
        parts += [f"refresh {self.refresh:g}s", f"lease {self.lease:g}s", f"safe {self.safe}"]
        if self.cap:
            parts.append(f"cap {self.cap}")
        if self.adaptive:
            parts.append(f"adaptive, floor {self.floor}")
        if self.sliding:
            parts.append("sliding")
        return ", ".join(parts)

    def but(self, **changes: Any) -> QuotaConfig:
        return replace(self, **changes)


def _guess(word: str, choices: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for the one choice that begins with the word or
    is close to it, as a rule file's misspellings are answered; else nothing."""
    choices = tuple(choices)
    begins = [choice for choice in choices if word and choice.startswith(word)]
    found = begins if len(begins) == 1 else difflib.get_close_matches(word, choices, n=1)
    return f"; did you mean {found[0]!r}?" if found else ""

"""Reservations: a cost known only after the call (LLM tokens, bytes, rows).

``limiter.reserve(key, cost=estimate)`` is a hit of the estimate, admitted or
denied as a hit is, and returns a `Reservation`; ``settle(actual)`` charges or
refunds ``actual - estimate``, ``cancel()`` refunds the whole estimate. What is
never settled stays charged at its estimate: the charge is made when the
reservation is admitted, so nothing has to happen when its holder forgets it,
dies, or drops the object. How each algorithm takes an over-run or a refund is
`ratewarden.algorithms.settle`'s (docs/algorithms.md, "Reservations").

`Estimates` learns the estimate: ``reserve(key, profile="chat")`` reserves a
high quantile of what that profile's last settles used.

The twins share everything (`_Held`, whose settle is a flow, see `_flow`);
`Reservation` drives it with `drive`, `AsyncReservation` with `adrive`.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from ._decision import Decision
from ._errors import ConfigurationError, RatewardenError
from ._flow import Flow, adrive, drive
from .stores.reservations import AsyncReserver, Reserver

__all__ = ["AsyncReservation", "Estimates", "Learned", "Reservation", "ReservationError"]

R = TypeVar("R", Reserver, AsyncReserver)  # the store's reservations, sync or async


class ReservationError(RatewardenError, ValueError):
    """A reservation was settled twice, after a cancel, without being admitted, or
    with an actual cost that is not a whole number >= 0. Nothing was charged or
    refunded: the reservation stays as it was."""


@dataclass(frozen=True, slots=True)
class Estimates:
    """How a limiter learns what to reserve for a profile (``reserve(key,
    profile=...)`` without a cost): the ``quantile`` (nearest rank) of the
    profile's last ``size`` settled actual costs, within ``[floor, ceiling]``.
    A profile with no settle yet reserves ``ceiling``, the worst case. At most
    ``profiles`` profiles are kept, the least recently used one forgotten first:
    memory stays bounded (``profiles * size`` numbers) whatever names callers use.
    """

    ceiling: int
    floor: int = 1
    quantile: float = 0.95
    size: int = 512
    profiles: int = 256

    def __post_init__(self) -> None:
        for name in ("ceiling", "floor", "size", "profiles"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigurationError(
                    f"Estimates: {name} must be a positive integer, got {value!r}"
                )
        if self.floor > self.ceiling:
            raise ConfigurationError(
                f"Estimates: floor {self.floor} is above ceiling {self.ceiling}"
            )
        q = self.quantile
        if type(q) not in (int, float) or not 0 < q <= 1:
            raise ConfigurationError(f"Estimates: quantile is in (0, 1], got {q!r}")


class Learned:
    """`Estimates` at work for one limiter: a ring of the last actual costs per
    profile, and each profile's estimate, worked out again after a settle."""

    def __init__(self, estimates: Estimates) -> None:
        self.estimates = estimates
        self._rings: OrderedDict[str, deque[int]] = OrderedDict()
        self._cached: dict[str, int] = {}
        self._lock = threading.Lock()

    def estimate(self, profile: str) -> int:
        """What ``reserve(key, profile=profile)`` reserves now."""
        cached = self._cached.get(profile)
        if cached is not None:
            return cached
        e = self.estimates
        with self._lock:
            ring = self._rings.get(profile)
            if not ring:
                return e.ceiling
            ordered = sorted(ring)
        rank = max(math.ceil(e.quantile * len(ordered)), 1)
        value = min(max(ordered[rank - 1], e.floor), e.ceiling)
        self._cached[profile] = value
        return value

    def record(self, profile: str, actual: int) -> None:
        with self._lock:
            ring = self._rings.get(profile)
            if ring is None:
                ring = self._rings[profile] = deque(maxlen=self.estimates.size)
                if len(self._rings) > self.estimates.profiles:
                    gone, _ = self._rings.popitem(last=False)
                    self._cached.pop(gone, None)
            else:
                self._rings.move_to_end(profile)
            ring.append(actual)
            self._cached.pop(profile, None)

    def __repr__(self) -> str:
        return f"<Learned profiles={len(self._rings)}, {self.estimates!r}>"


def check_reservable(shards: int, adaptive: object, two_tier: bool) -> None:
    """Reservations settle one key's state in one store call: a limit split over
    shards, priced in units or counted locally cannot."""
    if shards != 1 or adaptive is not None or two_tier:
        raise ConfigurationError("reserve works on a plain limit: no shards, adaptive or two_tier")


def estimate_for(
    learned: Learned | None, cost: int | None, profile: str | None
) -> tuple[int, str | None]:
    """The cost to reserve: ``cost`` if given, else the profile's estimate."""
    if profile is not None:
        if learned is None:
            raise ConfigurationError(
                "reserve(profile=...) learns from settles: make the limiter with"
                " estimates=Estimates(ceiling=...)"
            )
        if not isinstance(profile, str) or not profile:  # type: ignore[redundant-expr]
            raise ConfigurationError(f"profile must be a non-empty string, got {profile!r}")
    if cost is None:
        if profile is None:
            raise ConfigurationError("reserve needs cost=<estimate> or profile=<name>")
        return learned.estimate(profile), profile  # type: ignore[union-attr]
    if type(cost) is not int or cost < 1:
        raise ConfigurationError(f"an estimate (cost) must be a positive integer, got {cost!r}")
    return cost, profile


class _Held(Generic[R]):
    """What both twins keep and check, and their settle as a flow (see `_flow`)."""

    __slots__ = (
        "_open", "_reserver", "_state", "decision", "estimate", "key", "learned", "mark",
        "profile",
    )  # fmt: skip

    def __init__(
        self, reserver: R, key: str, estimate: int, decision: Decision, mark: int,
        *, profile: str | None = None, learned: Learned | None = None,
    ) -> None:  # fmt: skip
        self._reserver: R = reserver
        self.key, self.estimate, self.decision, self.mark = key, estimate, decision, mark
        self.profile, self.learned = profile, learned
        # one token: taking it (an atomic pop) is the right to settle or cancel once
        self._open = [1] if decision.allowed else []
        self._state = "open" if decision.allowed else "denied"

    @property
    def allowed(self) -> bool:
        return self.decision.allowed

    @property
    def limit(self) -> int:
        return self.decision.limit

    @property
    def remaining(self) -> int:
        return self.decision.remaining

    @property
    def reset_after(self) -> float:
        return self.decision.reset_after

    @property
    def retry_after(self) -> float:
        return self.decision.retry_after

    @property
    def rule(self) -> str | None:
        return self.decision.rule

    @property
    def reason(self) -> str | None:
        return self.decision.reason

    @property
    def state(self) -> str:
        """``"open"``, ``"settled"``, ``"cancelled"`` or ``"denied"``."""
        return self._state

    def __bool__(self) -> bool:
        return self.decision.allowed

    def _settling(self, actual: object, *, cancel: bool = False) -> Flow[None]:
        """A settle (or, with ``cancel``, a cancel) as a flow: checks, then the
        store's call, if there is a difference to apply. A check that fails or a
        call that raises leaves the reservation as it was."""
        if not cancel and (type(actual) is not int or actual < 0):
            raise ReservationError(
                f"settle takes the actual cost, a whole number >= 0, got {actual!r}"
            )
        try:
            self._open.pop()
        except IndexError:
            raise ReservationError(
                f"reservation of {self.estimate} on {self.key!r} is {self._state}:"
                " it can be settled or cancelled once, and only if admitted"
            ) from None
        used = 0 if cancel else actual
        assert isinstance(used, int)
        delta = used - self.estimate
        if delta and not self.decision.degraded:  # a degraded admission counted nothing
            try:
                yield partial(self._reserver.settle, self.key, delta, self.mark, self.estimate)
            except BaseException:  # the call raised (the flow is closed): still open
                self._open.append(1)
                raise
        if cancel:
            self._state = "cancelled"
            return
        self._state = "settled"
        if self.profile is not None and self.learned is not None:
            self.learned.record(self.profile, used)

    def __repr__(self) -> str:
        profile = "" if self.profile is None else f", profile={self.profile!r}"
        return (
            f"<{type(self).__name__} {self._state} key={self.key!r}, estimate={self.estimate}"
            f"{profile}, remaining={self.decision.remaining}>"
        )


class Reservation(_Held[Reserver]):
    """An estimated cost held against a limit (see `ratewarden.Limiter.reserve`).
    Truthy when admitted; ``decision`` is the hit's Decision, whose fields it
    also shows. ``settle(actual)`` or ``cancel()`` once; neither: the estimate
    stays charged."""

    __slots__ = ()

    def settle(self, actual: int) -> None:
        """Charge ``actual - estimate`` more, or refund it (see the module docstring)."""
        drive(self._settling(actual))

    def cancel(self) -> None:
        """Refund the whole estimate: the call was not made."""
        drive(self._settling(None, cancel=True))


class AsyncReservation(_Held[AsyncReserver]):
    """The asyncio twin of `Reservation`: ``await r.settle(actual)``,
    ``await r.cancel()``."""

    __slots__ = ()

    async def settle(self, actual: int) -> None:
        """`Reservation.settle`, awaited."""
        await adrive(self._settling(actual))

    async def cancel(self) -> None:
        """`Reservation.cancel`, awaited."""
        await adrive(self._settling(None, cancel=True))

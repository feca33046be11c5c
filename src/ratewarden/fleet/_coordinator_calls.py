"""The coordinator's calls planned, no I/O: ``fleet.lua``'s keys, each
operation's arguments (a member's refresh from its `Report`), and its reply
read into `Reply` or `QuotaStatus`.

`AsyncCoordinator` and its generated twin `Coordinator` only send the calls.
Keys carry the hash tag ``{rw:quota:NAME}`` so that a Redis Cluster keeps a
resource's state on one node.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..primitives import Clock, StoreUnavailable
from .alloc import MILLI, Piece
from .config import QuotaConfig, check_name

__all__ = [
    "CoordinatorBase",
    "MemberStatus",
    "QuotaStatus",
    "Reply",
    "Report",
    "channel",
    "failure",
    "keys",
    "parse_refresh",
    "parse_set",
    "parse_show",
    "refresh_args",
    "set_args",
    "source",
]

_SOURCE: list[str] = []


def source() -> str:
    if not _SOURCE:
        _SOURCE.append((resources.files("ratewarden.fleet") / "fleet.lua").read_text())
    return _SOURCE[0]


def keys(name: str) -> list[str]:
    tag = f"{{rw:quota:{check_name(name)}}}"
    return [f"{tag}:cfg", f"{tag}:members"]


def channel(name: str) -> str:
    """Where a change of the resource's total is published."""
    return f"rw:quota:{check_name(name)}:changes"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(flat: list[Any]) -> dict[str, str]:
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


@dataclass(frozen=True, slots=True)
class Report:
    """What a member's refresh tells the coordinator, in millipermits per window:
    built by the member (`Member.report`), sent whole by each coordinator (the
    twins, the model, the simulator's backends).

    ``wants``, ``has``, ``used``: its demand, what it holds, what it spent;
    ``throttled``: the provider's refusals since its last report while it kept
    its share; ``pieces``: where it says its grant lies on the line;
    ``restore``: the configuration to create the resource from if it is
    missing (the one last seen stored, with its version: restored with a
    rebuild; one never stored: created as `set` creates it); ``paced``: it
    paces its permits (space it gives up is left out of ``hard_ms``, which
    older members read; see fleet.lua)."""

    wants: int
    has: int
    used: int
    throttled: int = 0
    pieces: tuple[Piece, ...] = ()
    restore: dict[str, str] | None = None
    paced: bool = False


@dataclass(frozen=True, slots=True)
class Reply:
    """The coordinator's answer to a refresh (millipermits per window)."""

    grant: int
    held: int
    pieces: tuple[Piece, ...]  # where the grant lies on the line [0, total)
    members: int
    now_ms: int
    fields: dict[str, str]
    # what the member falls back to without Redis: its part of the safe shares,
    # which add up to at most the total (None: compute it from the fields)
    safe: int | None = None
    # what the allocation gives it once the others have shrunk to theirs
    target: int | None = None

    @property
    def effective_total(self) -> int:
        return int(self.fields.get("eff_m", "0"))


def _share(part: float, whole: float) -> float | None:
    """``part / whole`` held to [0, 1]; None when ``whole`` is nothing.

    Clamped because the figures come from different moments: a member's ``used``
    is what it spent a window since its previous report, its ``has`` what the
    coordinator granted at its last one, and the members' reports do not line
    up; so a grant cut between two reports, or demand measured below what was
    then spent, makes the ratio pass 1 without any window of the provider's
    passing the total. The permits themselves stay as they were reported.
    """
    if whole <= 0:
        return None
    return min(1.0, max(0.0, part / whole))


def _ratio(value: float | None) -> float | None:
    """A share as JSON shows it: six decimals, far finer than the figures it
    divides, without a division's float noise (0.9950000000000001)."""
    return None if value is None else round(value, 6)


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One member as the coordinator sees it; permits a window."""

    id: str
    wants: float
    has: float
    used: float
    expires_in: float  # seconds

    @property
    def used_of_grant(self) -> float | None:
        """Used over its grant, at most 1; None while it holds nothing."""
        return _share(self.used, self.has)

    @property
    def demand_served(self) -> float | None:
        """Used over what it wants, at most 1; None while it wants nothing."""
        return _share(self.used, self.wants)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "wants": self.wants,
            "has": self.has,
            "used": self.used,
            "expires_in": round(self.expires_in, 3),
            "used_of_grant": _ratio(self.used_of_grant),
            "demand_served": _ratio(self.demand_served),
        }


@dataclass(frozen=True, slots=True)
class QuotaStatus:
    """A resource: its configuration, effective total and live members."""

    name: str
    config: QuotaConfig
    effective_total: float  # permits a window: below the configured total when adaptive cut it
    version: int
    members: tuple[MemberStatus, ...]

    # The members' figures are thousandths of a permit (the coordinator keeps
    # milli-permits): their sums are rounded to that, so that 33.317 + 33.117 +
    # 33.117 reads 99.551 and not 99.55099999999999.

    @property
    def wants(self) -> float:
        return round(sum(m.wants for m in self.members), 3)

    @property
    def granted(self) -> float:
        return round(sum(m.has for m in self.members), 3)

    @property
    def used(self) -> float:
        return round(sum(m.used for m in self.members), 3)

    @property
    def used_of_total(self) -> float:
        """Permits used over the effective total, at most 1: how much of the
        provider's limit the fleet spends."""
        return _share(self.used, self.effective_total) or 0.0

    @property
    def demand_served(self) -> float | None:
        """Permits used over what the fleet could have used, min(effective total,
        wants), at most 1; None while no member wants anything."""
        return _share(self.used, min(self.effective_total, self.wants))

    @property
    def utilisation(self) -> float:
        """`demand_served` before it is clamped (0 for no demand), as the first
        readers of ``/v1/quotas`` got it; it passes 1 when members used more
        than they wanted."""
        room = min(self.effective_total, self.wants)
        return self.used / room if room > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        config = self.config
        return {
            "name": self.name,
            "rate": str(config.rate),
            "total": config.rate.limit,
            "window": config.rate.period,
            "effective_total": self.effective_total,
            "algorithm": config.algorithm,
            "refresh": config.refresh,
            "lease": config.lease,
            "safe": config.safe,
            "cap": config.cap,
            "adaptive": config.adaptive,
            "floor": config.floor,
            "sliding": config.sliding,
            "version": self.version,
            "wants": self.wants,
            "granted": self.granted,
            "used": self.used,
            "used_of_total": _ratio(self.used_of_total),
            "demand_served": _ratio(self.demand_served),
            "utilisation": _ratio(self.utilisation),
            "members": [m.as_dict() for m in self.members],
        }


def parse_refresh(raw: list[Any]) -> Reply | None:
    if int(raw[0]) == 0:
        return None
    flat = [int(x) for x in raw[3]]
    pieces = tuple(zip(flat[::2], flat[1::2], strict=True))
    safe = int(raw[7]) if len(raw) > 7 else None
    target = int(raw[8]) if len(raw) > 8 else None
    fields = _fields(list(raw[6]))
    return Reply(int(raw[1]), int(raw[2]), pieces, int(raw[4]), int(raw[5]), fields, safe, target)


def parse_show(name: str, raw: list[Any]) -> QuotaStatus | None:
    if int(raw[0]) == 0:
        return None
    now = int(raw[1])
    fields = _fields(list(raw[2]))
    members = tuple(
        MemberStatus(
            _text(m[0]),
            int(m[3]) / MILLI,
            int(m[4]) / MILLI,
            int(m[5]) / MILLI,
            (int(m[2]) - now) / 1000,
        )
        for m in raw[3:]
    )
    return QuotaStatus(
        name,
        QuotaConfig.from_fields(fields),
        int(fields.get("eff_m", "0")) / MILLI,
        int(fields.get("version", "0")),
        members,
    )


def _time(clock: Clock | None) -> str:
    return "" if clock is None else str(clock.time_ns() // 1_000_000)


def refresh_args(member: str, report: Report) -> list[Any]:
    """The script's refresh arguments, in the layout every version of the
    member sends (a fleet upgrades one member at a time)."""
    spans = " ".join(f"{start} {length}" for start, length in report.pieces)
    paced = "paced" if report.paced else ""
    args: list[Any] = [
        member, report.wants, report.has, report.used, report.throttled, spans, paced
    ]  # fmt: skip
    for pair in (report.restore or {}).items():
        args.extend(pair)
    return args


def set_args(config: QuotaConfig) -> list[Any]:
    """The configuration's fields, flattened into the script's arguments."""
    return [part for pair in config.fields().items() for part in pair]


def parse_set(raw: list[Any]) -> int:
    """The resource's new version."""
    return int(raw[1])


class CoordinatorBase:
    """What both coordinators share: the resource's keys and channel, the script's
    digest, and each call's arguments; the twins only send the call."""

    def __init__(self, client: Any, name: str, *, clock: Clock | None = None) -> None:
        self.client = client
        self.name = check_name(name)
        self.keys = keys(name)
        self.channel = channel(name)
        self.clock = clock  # None: the Redis server's clock
        self._sha = hashlib.sha1(source().encode(), usedforsecurity=False).hexdigest()

    def _args(self, op: str, rest: list[Any]) -> list[Any]:
        return [*self.keys, op, self.channel, _time(self.clock), *rest]


def failure(exc: Exception) -> StoreUnavailable:
    return StoreUnavailable(f"redis: quota coordination failed: {exc}")

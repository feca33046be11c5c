"""Fleet quotas as the service answers them: the shapes of ``GET /v1/quotas`` and
``GET /v1/quotas/{name}``, without I/O.

The answers are `QuotaStatus.as_dict()` (and `summary` of it), encoded as they
are; the structs below only describe them to the OpenAPI document, and a test
holds them to ``as_dict()``'s keys, so that neither can drift from the other.
Imports msgspec alone: ``openapi()`` needs the shapes with no Redis client
installed, and ``ratewarden quota list --json`` prints `summary` too. Reading
them is `_quota_reader`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from ..fleet import QuotaStatus

__all__ = [
    "MAX_LISTED",
    "MAX_SCRAPED",
    "Quota",
    "QuotaFigures",
    "QuotaList",
    "QuotaMember",
    "QuotaSummary",
    "summary",
]


# Resources read for one listing, and for one /metrics scrape (a script call each).
MAX_LISTED = 1000
MAX_SCRAPED = 100


class QuotaMember(msgspec.Struct):
    """A live member; permits a window, and seconds its lease has left.
    ``used_of_grant``: used over has; ``demand_served``: used over wants; each
    at most 1, and null while the part below is 0."""

    id: str
    wants: float
    has: float
    used: float
    expires_in: float
    used_of_grant: float | None
    demand_served: float | None


class QuotaFigures(msgspec.Struct):
    """A resource's configuration and its members' sums, permits a window.
    ``used_of_total``: used over effective_total, at most 1. ``demand_served``:
    used over min(effective_total, wants), at most 1, null when no member wants
    anything. ``utilisation``: that ratio unclamped (0 for no demand), kept for
    the readers that had it before ``demand_served``; it can pass 1."""

    name: str
    rate: str
    total: int
    window: float
    effective_total: float
    algorithm: str
    refresh: float
    lease: float
    safe: str | int
    cap: int
    adaptive: bool
    floor: int
    sliding: bool
    version: int
    wants: float
    granted: float
    used: float
    used_of_total: float
    demand_served: float | None
    utilisation: float


class Quota(QuotaFigures):
    """``GET /v1/quotas/{name}``: the resource and its live members."""

    members: list[QuotaMember]


class QuotaSummary(QuotaFigures):
    """One resource of ``GET /v1/quotas``: its members counted, not listed."""

    members: int


class QuotaList(msgspec.Struct):
    """``truncated``: there were more than the ``MAX_LISTED`` resources listed."""

    quotas: list[QuotaSummary]
    truncated: bool


def summary(status: QuotaStatus) -> dict[str, Any]:
    """``status.as_dict()`` with the number of members in place of the members."""
    figures = status.as_dict()
    figures["members"] = len(status.members)
    return figures

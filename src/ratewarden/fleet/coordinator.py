"""Talking to the coordinator: ``fleet.lua`` in Redis, one script call per operation.

The arguments and replies are built and read once (`_coordinator_calls`);
`AsyncCoordinator` only sends them, and `Coordinator` is generated from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._coordinator_calls import (
    MemberStatus,
    QuotaStatus,
    Reply,
    Report,
    channel,
    keys,
    parse_refresh,
    parse_show,
)

if TYPE_CHECKING:
    from ._acoordinator import AsyncCoordinator
    from ._coordinator import Coordinator


def __getattr__(name: str) -> Any:
    """The coordinators need a Redis client: loaded on first use, so that the
    calls' shapes (`Report`, `Reply`, `parse_refresh`) come without one."""
    if name == "AsyncCoordinator":
        from ._acoordinator import AsyncCoordinator  # noqa: PLC0415

        return AsyncCoordinator
    if name == "Coordinator":
        from ._coordinator import Coordinator  # noqa: PLC0415

        return Coordinator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AsyncCoordinator",
    "Coordinator",
    "MemberStatus",
    "QuotaStatus",
    "Reply",
    "Report",
    "channel",
    "keys",
    "parse_refresh",
    "parse_show",
]

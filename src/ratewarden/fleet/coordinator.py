"""Talking to the coordinator: ``fleet.lua`` in Redis, one script call per operation.

The arguments and replies are built and read once (`_coordinator_calls`);
`AsyncCoordinator` only sends them, and `Coordinator` is generated from it.
"""

from ._acoordinator import AsyncCoordinator
from ._coordinator import Coordinator
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

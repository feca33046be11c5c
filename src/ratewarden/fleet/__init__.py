"""Fleet quotas: one provider's limit shared by every instance of a service.

    quota = FleetQuota("push-api", "redis://redis:6379/0", config="2000/second", pace=True)
    with quota:
        quota.acquire(max_wait=1.0)      # local: no network call, ever
        call_the_provider()

Each member spends its own share locally; every refresh (default 1 s) it tells
the coordinator, a Lua script in Redis, what it wanted and what it holds, and
gets its grant back. The coordinator splits the total ``equal``-ly or by demand
(``proportional_share``, ``fair_share``: max-min fair, or ``static`` caps) and
never grants a member more than the total minus what the others hold. See
docs/fleet.md.

`RegionSplit` splits a global limit across regions that each have their own
Redis: `RegionalLimiter` enforces a region's share exactly there, and
`RegionRebalancer` moves the shares with the same coordinator by measured demand.

Install with ``pip install ratewarden[redis]``.
"""

from ._admin import alist_quotas, ashow_quota, list_quotas, set_quota, show_quota
from ._aquota import AsyncFleetQuota, AsyncQuotaSlot
from ._quota import FleetQuota, QuotaSlot
from ._regionio import RegionalLimiter, RegionRebalancer
from ._regions import RegionSplit
from .alloc import ALLOCATORS, allocate
from .config import QuotaConfig
from .coordinator import AsyncCoordinator, Coordinator, MemberStatus, QuotaStatus, Report

__all__ = [
    "ALLOCATORS",
    "AsyncCoordinator",
    "AsyncFleetQuota",
    "AsyncQuotaSlot",
    "Coordinator",
    "FleetQuota",
    "MemberStatus",
    "QuotaConfig",
    "QuotaSlot",
    "QuotaStatus",
    "RegionRebalancer",
    "RegionSplit",
    "RegionalLimiter",
    "Report",
    "alist_quotas",
    "allocate",
    "ashow_quota",
    "list_quotas",
    "set_quota",
    "show_quota",
]

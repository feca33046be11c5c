"""The Envoy quota buckets of a service on the memory store, coordinated in
this process (`rlqs.LocalCoordinators`): read as ``/v1/quotas`` and the quota
gauges of ``/metrics`` read fleet quotas from Redis, with the same answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._quotas import MAX_SCRAPED

if TYPE_CHECKING:
    from ..fleet import QuotaStatus
    from ..rlqs import QuotaService

__all__ = ["LocalQuotas"]


class LocalQuotas:
    def __init__(self, service: QuotaService) -> None:
        self.service = service

    async def show(self, name: str) -> QuotaStatus | None:
        return await self.service.coordinators.show(name)

    async def read(self, limit: int) -> tuple[list[QuotaStatus], bool]:
        statuses = sorted(await self.service.statuses(), key=lambda s: s.name)
        return statuses[:limit], len(statuses) > limit

    async def gauges(self) -> Sequence[QuotaStatus]:
        statuses, _ = await self.read(MAX_SCRAPED)
        return statuses

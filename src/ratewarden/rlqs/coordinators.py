"""Where the buckets' quotas are coordinated: in this process (one ratewarden
serving every proxy), or in Redis through the fleet's coordinator (several
ratewardens serving one fleet of proxies, any proxy on any of them).

Both answer a member's refresh with the fleet coordinator's `Reply`, creating a
bucket's resource from its configuration the first time it is reported.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

from ..fleet.config import QuotaConfig
from ..fleet.coordinator import QuotaStatus, Reply, Report, parse_refresh, parse_show
from ..fleet.model import Model
from ..primitives import Clock, SystemClock

__all__ = ["Coordinators", "LocalCoordinators", "RedisCoordinators"]


class Coordinators(Protocol):
    async def refresh(self, resource: str, member: str, report: Report) -> Reply:
        """``member``'s report; a missing resource is made from ``report.restore``."""
        ...

    async def set(self, resource: str, config: QuotaConfig) -> None: ...

    async def show(self, resource: str) -> QuotaStatus | None: ...

    async def leave(self, resource: str, member: str) -> None: ...

    def forget(self, resource: str) -> None:
        """The bucket is no longer tracked here: drop what is kept for it."""
        ...


def _created(reply: Reply | None, resource: str) -> Reply:
    if reply is None:  # a report carrying its configuration always finds or makes one
        raise RuntimeError(f"the coordinator did not create {resource}")
    return reply


class LocalCoordinators:
    """The coordinator's model (`fleet.model.Model`) per bucket, in memory: the
    same allocation and invariant as in Redis, for one ratewarden."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self._models: OrderedDict[str, Model] = OrderedDict()

    def _now(self) -> int:
        return self.clock.time_ns() // 1_000_000

    async def refresh(self, resource: str, member: str, report: Report) -> Reply:
        model = self._models.get(resource)
        if model is None:
            model = self._models[resource] = Model()
        raw = model.refresh(self._now(), member, report)
        model.published.clear()  # nobody listens for nudges here: the proxies report anyway
        return _created(parse_refresh(raw), resource)

    async def set(self, resource: str, config: QuotaConfig) -> None:
        model = self._models.get(resource)
        if model is not None:
            model.set(self._now(), config.fields())
            model.published.clear()

    async def leave(self, resource: str, member: str) -> None:
        model = self._models.get(resource)
        if model is not None:
            model.leave(self._now(), member)

    async def show(self, resource: str) -> QuotaStatus | None:
        model = self._models.get(resource)
        return None if model is None else parse_show(resource, model.show(self._now()))

    def forget(self, resource: str) -> None:
        self._models.pop(resource, None)


class RedisCoordinators:
    """``fleet.lua`` in Redis, one resource a bucket, through ``client`` (a
    ``redis.asyncio`` client: the service's store's)."""

    def __init__(self, client: Any) -> None:
        from ..fleet.coordinator import AsyncCoordinator  # noqa: PLC0415 - the redis extra

        self.client = client
        self._make = AsyncCoordinator
        self._coordinators: dict[str, Any] = {}

    def _of(self, resource: str) -> Any:
        found = self._coordinators.get(resource)
        if found is None:
            found = self._coordinators[resource] = self._make(self.client, resource)
        return found

    async def refresh(self, resource: str, member: str, report: Report) -> Reply:
        return _created(await self._of(resource).report(member, report), resource)

    async def set(self, resource: str, config: QuotaConfig) -> None:
        await self._of(resource).set(config)

    async def leave(self, resource: str, member: str) -> None:
        await self._of(resource).leave(member)

    async def show(self, resource: str) -> QuotaStatus | None:
        status: QuotaStatus | None = await self._of(resource).show()
        return status

    def forget(self, resource: str) -> None:
        self._coordinators.pop(resource, None)

"""Reading fleet quotas through the asyncio Redis client of the service's store:
what ``/v1/quotas`` and the quota gauges of ``/metrics`` show.

Imported only when the store is Redis (it imports ``ratewarden.fleet``, and so
the redis extra). Every read is bounded: at most ``limit`` resources, one
script call each, all within ``deadline`` seconds; past it the read fails as
the store failing does, with `StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..fleet import QuotaStatus, alist_quotas, ashow_quota
from ..fleet.config import check_name
from ..primitives import ConfigurationError, StoreError, StoreUnavailable
from ._quotas import MAX_SCRAPED

__all__ = ["QuotaReader"]

log = logging.getLogger("ratewarden.server")


class QuotaReader:
    def __init__(self, client: Any, *, deadline: float = 3.0) -> None:
        self.client = client
        self.deadline = deadline

    async def show(self, name: str) -> QuotaStatus | None:
        """One resource; None if it does not exist. `ConfigurationError` for a
        name no resource can have; `StoreError` for a configuration in Redis
        that cannot be read."""
        check_name(name)
        async with _bounded(self.deadline, f"reading quota {name!r}"):
            try:
                return await ashow_quota(self.client, name)
            except ConfigurationError as exc:
                raise StoreError(f"redis: quota {name!r}: {exc}") from exc

    async def read(self, limit: int) -> tuple[list[QuotaStatus], bool]:
        """Up to ``limit`` resources, sorted by name, and whether there were more.
        A resource gone since it was listed, or one whose configuration cannot be
        read (a foreign key under the quotas' pattern), is left out."""
        async with _bounded(self.deadline, "reading the quotas"):
            names = await alist_quotas(self.client, limit + 1)
            statuses = []
            for name in names[:limit]:
                try:
                    status = await ashow_quota(self.client, name)
                except ConfigurationError:
                    continue
                if status is not None:
                    statuses.append(status)
        return statuses, len(names) > limit

    async def gauges(self) -> Sequence[QuotaStatus]:
        """The fleet quotas a /metrics scrape exports: none when Redis fails,
        rather than a failed scrape."""
        try:
            statuses, _ = await self.read(MAX_SCRAPED)
        except StoreError as exc:
            log.warning("fleet quota gauges left out of /metrics: %s", exc)
            return ()
        return statuses

    def __repr__(self) -> str:
        return f"<QuotaReader {self.client!r} deadline={self.deadline:g}s>"


@contextlib.asynccontextmanager
async def _bounded(seconds: float, what: str) -> AsyncIterator[None]:
    """``asyncio.timeout``, whose expiry is the store failing, not a TimeoutError."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise StoreUnavailable(f"redis: {what} took more than {seconds:g} s") from None

"""A fleet member refreshed by hand on a fake clock, for the tests on a real Redis."""

from __future__ import annotations

import redis

from ratewarden import FakeClock
from ratewarden.fleet import FleetQuota


def member(
    name: str, client: redis.Redis, clock: FakeClock, member_id: str, **options: object
) -> FleetQuota:
    """A member on a fake clock (its own and the coordinator's), refreshed by hand."""
    return FleetQuota(
        name,
        client,
        member_id=member_id,
        clock=clock,
        coordinator_clock=clock,
        background=False,
        **options,  # type: ignore[arg-type]
    )

"""What the tests of fleet quotas on a real Redis share: a client of the test's
server and a fresh resource name (fixtures, for the fleet's conftest and the quota
command's tests), and a member refreshed by hand on a fake clock."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from ratewarden import FakeClock
from ratewarden.fleet import FleetQuota
from tests.redis_server import RedisServer


@pytest.fixture
def client(redis_single: RedisServer) -> Iterator[redis.Redis]:
    with redis_single.client() as c:
        yield c


@pytest.fixture
def name() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"


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

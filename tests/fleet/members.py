"""What the tests of fleet quotas on a real Redis share: a client of the test's
server and a fresh resource name (fixtures, for the fleet's conftest and the quota
command's tests), and a member refreshed by hand on a fake clock."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

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


def blocking_member(
    where: tuple[str, str], member_id: str, threads: int, times: tuple[float, float, float],
    out: Any,
) -> None:  # fmt: skip
    """A process of its own: one member of a 200/second fair_share quota whose
    ``threads`` threads each block in acquire and ask again as soon as served,
    from ``times[0]`` (wall clock) to ``times[2]``; puts on ``out`` how many
    were served from ``times[1]`` on. ``where``: the Redis URL and the quota's name."""
    import threading  # noqa: PLC0415 - only this helper runs threads

    from ratewarden import RateLimitTimeout  # noqa: PLC0415
    from ratewarden.fleet import FleetQuota, QuotaConfig  # noqa: PLC0415

    url, name = where
    start, count_from, stop = times
    config = QuotaConfig("200/second", "fair_share", refresh=0.25, lease=1.0)
    quota = FleetQuota(name, url, config=config, member_id=member_id, pace=True)
    served = [0] * threads

    def work(i: int) -> None:
        while time.time() < stop:
            try:
                quota.acquire(max_wait=1.0)
            except RateLimitTimeout:
                continue
            if time.time() >= count_from:
                served[i] += 1

    quota.start()
    time.sleep(max(0.0, start - time.time()))
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(stop - time.time() + 5)
    quota.close()
    out.put((member_id, sum(served)))

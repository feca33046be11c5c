"""``_leases.lua`` against `LeaseTable`, on a real Redis and a real cluster, same
explicit clock: every take, renew, release and count answers the same four
integers (status, held, reclaimed, wait), reclaiming ended leases included."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given

from ratewarden.stores.leases import LeaseTable
from ratewarden.stores.redis.scripts import LEASES, Scripts
from tests.concurrency.strategies import lease_steps
from tests.redis_server import RedisCluster, RedisServer

EPOCH_US = 1_763_700_000_000_000  # 2025-11-21 in microseconds: realistic magnitudes


@pytest.fixture(scope="module", params=["single", "cluster"])
def scripts(request: pytest.FixtureRequest) -> Iterator[Scripts]:
    client: redis.Redis | redis.RedisCluster
    if request.param == "single":
        server: RedisServer = request.getfixturevalue("redis_single")
        client = server.client()
    else:
        cluster: RedisCluster = request.getfixturevalue("redis_6_nodes")
        client = cluster.client()
    with client:
        yield Scripts(client)


@given(steps=lease_steps())
def test_lua_equals_python(steps: list[tuple[Any, ...]], scripts: Scripts) -> None:
    table = LeaseTable()
    run = uuid.uuid4().hex  # keys of this example only, each its own hash tag
    now = EPOCH_US
    for gap, op, key, lease_id, limit, lease_us in steps:
        now += gap
        python = tuple(table.call(op, key, lease_id, limit, lease_us, now=now))
        whole = f"rw:conc:{{{run}:{key}}}"
        lua = tuple(scripts.call(LEASES, 1, [whole, op, lease_id, limit, lease_us, now]))
        assert lua == python, f"{op} {key} {lease_id} limit={limit} at +{now - EPOCH_US}us"


def test_the_set_expires_after_its_last_lease(scripts: Scripts) -> None:
    key = f"rw:conc:{{{uuid.uuid4().hex}:k}}"
    scripts.call(LEASES, 1, [key, "take", "a", 2, 5_000_000, EPOCH_US])
    scripts.call(LEASES, 1, [key, "take", "b", 2, 2_000_000, EPOCH_US + 1_000_000])
    ttl = scripts.client.pttl(key)
    assert 4000 <= ttl <= 5001, ttl  # the later expiry (a's), counted from the call's now
    scripts.call(LEASES, 1, [key, "release", "a", 2, 0, EPOCH_US + 1_000_000])
    scripts.call(LEASES, 1, [key, "release", "b", 2, 0, EPOCH_US + 1_000_000])
    assert not scripts.client.exists(key)


def test_server_time_is_read_when_no_clock_is_sent(scripts: Scripts) -> None:
    key = f"rw:conc:{{{uuid.uuid4().hex}:k}}"
    assert scripts.call(LEASES, 1, [key, "take", "a", 1, 1_000_000, ""]) == [1, 1, 0, 0]
    status, held, _, wait = scripts.call(LEASES, 1, [key, "take", "b", 1, 1_000_000, ""])
    assert (status, held) == (0, 1)
    assert 900_000 < wait <= 1_000_000

"""``_leases.lua`` against `LeaseTable`, on a real Redis and a real cluster, same
explicit clock: every take, renew, release, count and leave answers the same
five integers (status, held, reclaimed, wait, queued_at), reclaiming ended
leases and ending waiters' tickets included."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given

from ratewarden.stores.leases import LeaseTable, Place
from ratewarden.stores.redis.scripts import LEASES, Scripts
from tests.concurrency.strategies import lease_steps, queue_steps
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
        lua = tuple(scripts.call(LEASES, 3, [*keys(run, key), op, lease_id, limit, lease_us, now,
                                             0, 0, 0]))  # fmt: skip
        assert lua == python, f"{op} {key} {lease_id} limit={limit} at +{now - EPOCH_US}us"


def keys(run: str, key: str) -> list[str]:
    whole = f"rw:conc:{{{run}:{key}}}"
    return [whole, f"{whole}:w", f"{whole}:e"]


@given(steps=queue_steps())
def test_lua_equals_python_with_waiters_in_line(
    steps: list[tuple[Any, ...]], scripts: Scripts
) -> None:
    table = LeaseTable()
    run = uuid.uuid4().hex
    now = EPOCH_US
    places: dict[tuple[str, str], tuple[int, int]] = {}  # (key, id) -> (priority, queued_at)
    for gap, op, key, lease_id, limit, lease_us, asked, waits in steps:
        now += gap
        # a client keeps its priority and place while it waits
        priority, queued_at = places.get((key, lease_id), (asked, 0))
        ticket_us = 2_000_000 if waits or queued_at else 0  # in line, it waits on
        args = (op, key, lease_id, limit, lease_us, priority, queued_at, ticket_us)
        python = table.call(op, key, lease_id, limit, lease_us,
                            place=Place(priority, queued_at, ticket_us), now=now)  # fmt: skip
        lua = tuple(scripts.call(LEASES, 3, [*keys(run, key), op, lease_id, limit, lease_us, now,
                                             priority, queued_at, ticket_us]))  # fmt: skip
        assert lua == tuple(python), f"{args} at +{now - EPOCH_US}us"
        if python.queued_at:
            places[key, lease_id] = (priority, python.queued_at)
        elif op in ("take", "leave", "release"):
            places.pop((key, lease_id), None)


def test_the_set_expires_after_its_last_lease(scripts: Scripts) -> None:
    key = f"rw:conc:{{{uuid.uuid4().hex}:k}}"
    scripts.call(LEASES, 3, [*keys_of(key), "take", "a", 2, 5_000_000, EPOCH_US, 0, 0, 0])
    scripts.call(LEASES, 3, [*keys_of(key), "take", "b", 2, 2_000_000, EPOCH_US + 1_000_000,
                             0, 0, 0])  # fmt: skip
    ttl = scripts.client.pttl(key)
    assert 4000 <= ttl <= 5001, ttl  # the later expiry (a's), counted from the call's now
    for lease in "ab":
        scripts.call(LEASES, 3, [*keys_of(key), "release", lease, 2, 0, EPOCH_US + 1_000_000,
                                 0, 0, 0])  # fmt: skip
    assert not scripts.client.exists(key)


def test_server_time_is_read_when_no_clock_is_sent(scripts: Scripts) -> None:
    key = f"rw:conc:{{{uuid.uuid4().hex}:k}}"
    take = [*keys_of(key), "take"]
    assert scripts.call(LEASES, 3, [*take, "a", 1, 1_000_000, "", 0, 0, 0]) == [1, 1, 0, 0, 0]
    status, held, _, wait, _ = scripts.call(LEASES, 3, [*take, "b", 1, 1_000_000, "", 0, 0, 0])
    assert (status, held) == (0, 1)
    assert 900_000 < wait <= 1_000_000


def keys_of(key: str) -> list[str]:
    return [key, f"{key}:w", f"{key}:e"]


def test_the_waiters_sets_expire_after_their_last_ticket(scripts: Scripts) -> None:
    key = f"rw:conc:{{{uuid.uuid4().hex}:k}}"
    take = [*keys_of(key), "take"]
    scripts.call(LEASES, 3, [*take, "a", 1, 5_000_000, EPOCH_US, 0, 0, 0])
    answer = scripts.call(LEASES, 3, [*take, "b", 1, 5_000_000, EPOCH_US, 0, 0, 2_000_000])
    assert answer == [0, 1, 0, 5_000_000, EPOCH_US]  # in line from now
    for waiters in keys_of(key)[1:]:
        assert 1900 <= scripts.client.pttl(waiters) <= 2001
    scripts.call(LEASES, 3, [*keys_of(key), "leave", "b", 1, 0, EPOCH_US, 0, EPOCH_US, 0])
    assert not scripts.client.exists(*keys_of(key)[1:])

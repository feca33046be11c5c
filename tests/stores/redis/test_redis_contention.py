"""8 threads in each of 2 processes hammer one key in Redis: exactly the limit is
admitted, for every algorithm, on one server and on a cluster."""

from __future__ import annotations

import pytest

from tests.redis_server import RedisCluster, RedisServer
from tests.stores.contention import ALL, LIMIT, admitted


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALL)
def test_two_processes_eight_threads_each_admit_exactly_the_limit(
    redis_single: RedisServer, algorithm: str
) -> None:
    assert sum(admitted(redis_single.url, algorithm)) == LIMIT  # of 2,400 attempts


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALL)
def test_the_same_on_the_cluster(redis_6_nodes: RedisCluster, algorithm: str) -> None:
    assert sum(admitted(redis_6_nodes.url, algorithm)) == LIMIT

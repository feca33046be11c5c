"""The server the Redis suites start is the one RATEWARDEN_TEST_SERVER names: a run
meant for Valkey that quietly ran on Redis (or the reverse) would prove nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.redis_server import SERVER_ENV, RedisCluster, RedisServer, flavour


def name_of(info: dict[str, object]) -> str:
    """Valkey says ``server_name:valkey`` (and a redis_version for old clients); Redis
    says no server_name."""
    return str(info.get("server_name", "redis"))


def test_the_single_server_is_the_flavour_asked_for(redis_single: RedisServer) -> None:
    with redis_single.client() as client:
        info = client.info("server")
    assert name_of(info) == flavour(), info
    if flavour() == "valkey":
        assert str(info["valkey_version"]).startswith("9."), info


def test_every_cluster_node_is_the_flavour_asked_for(redis_6_nodes: RedisCluster) -> None:
    for node in redis_6_nodes.nodes:
        with node.client() as client:
            assert name_of(client.info("server")) == flavour()


@pytest.mark.parametrize("value", ["valky", "keydb"])
def test_an_unknown_server_stops_the_run_with_the_choices(value: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", __file__],
        env={**os.environ, SERVER_ENV: value},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode != 0
    assert f"{SERVER_ENV}={value!r}: the tests run against one of redis, valkey" in run.stderr

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


def test_a_port_taken_before_the_server_binds_it_is_traded_for_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between finding a port free and the server binding it, another process
    may take it (a busy machine's outgoing connections take ports from the range
    a cluster's bus port is in): the next port is tried, not the test failed."""
    import socket  # noqa: PLC0415 - this test alone holds a port

    from tests import redis_server as module  # noqa: PLC0415

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))  # bound, not listening: as an outgoing connection's
        taken = blocker.getsockname()[1]
        first = [taken]
        real = module.free_port

        def free_port(*, cluster: bool = False) -> int:
            return first.pop() if first else real(cluster=cluster)

        monkeypatch.setattr(module, "free_port", free_port)
        with module.redis_server() as server, server.client() as client:
            assert server.port != taken
            assert client.ping()

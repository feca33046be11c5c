from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from ratewarden import FakeClock, MemoryStore
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.redis_server import (
    LIVE,
    SERVER_ENV,
    RedisCluster,
    RedisServer,
    flavour,
    redis_cluster,
    redis_server,
    server_version,
)

PRODUCTION_TIMEOUT = 0.05  # the stores' own default

# One test-wide default for the Redis stores' timeout (tests.redis_server.LIVE):
# a store a test builds without a timeout of its own waits as long as a busy
# machine needs for a healthy round trip. The tests of a timeout, and the fault
# tests, give theirs; processes the tests start (serve, workers) set their own.
for _store in (RedisStore, AsyncRedisStore):
    _defaults = _store.__init__.__kwdefaults__
    assert _defaults is not None
    assert _defaults["timeout"] == PRODUCTION_TIMEOUT, _defaults
    _defaults["timeout"] = LIVE

# Hypothesis's own 100 examples a property in ./dev test: the properties' example
# generation and naive models were a third of the parallel pass's CPU at 200, and
# the suite has 12 minutes on a busy 2-core machine. HYPOTHESIS_PROFILE=deep searches
# ten times longer, for a change to an algorithm or a script; fast is the Valkey pass's.
_SLOW_OK = [HealthCheck.too_slow]
settings.register_profile(
    "default", max_examples=100, deadline=None, suppress_health_check=_SLOW_OK
)
settings.register_profile("deep", max_examples=1000, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile("fast", max_examples=40, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: run alone, after the parallel pass (SERIAL)")
    flavour()  # a RATEWARDEN_TEST_SERVER the tests do not know stops the run at once


# Tests that hold a store to its production timeouts (50 ms) while they break
# things: ./dev test runs them after the rest, alone, since the parallel pass
# keeps both cores busy (`-m serial`, `-m "not serial"`).
SERIAL = ("tests/faults/",)


# The parallel pass's longest tests (real Envoys, browsers, simulations, the docs'
# commands: `--durations` in ./dev test names them), handed to the workers first:
# collected last, they ran at the end while the other workers sat idle.
FIRST = (
    "tests/system/",
    "tests/test_docs.py",
    "tests/fleet/test_simulate.py",
    "tests/fleet/test_example_fleet.py",
    "tests/fleet/test_fallback.py",
    "tests/testing/",
    "tests/server/test_serve.py",
    "tests/server/test_serve_start.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
    # stable: each module's tests stay together and in order
    items.sort(key=lambda item: not item.nodeid.startswith(FIRST))


def pytest_report_header(config: pytest.Config) -> str:
    """Which server the Redis tests start: the same suite runs against Redis and Valkey."""
    try:
        return f"{SERVER_ENV}={flavour()}: {server_version()}"
    except pytest.fail.Exception as exc:  # each test that needs it fails with the same reason
        return f"{SERVER_ENV}={flavour()}: {exc.msg}"


@pytest.fixture(scope="session")
def redis_single() -> Iterator[RedisServer]:
    """One redis-server of our own for the whole run, on a free loopback port."""
    with redis_server() as server:
        yield server


@pytest.fixture(scope="session")
def redis_6_nodes() -> Iterator[RedisCluster]:
    """A real Redis Cluster of our own: 3 masters, 3 replicas, free loopback ports."""
    with redis_cluster() as cluster:
        yield cluster


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock (the rule and envoy tests' default; a module may define its own)."""
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    """An in-memory store on ``clock``."""
    return MemoryStore(clock=clock)

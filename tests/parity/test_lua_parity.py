"""Every Lua script against the pure Python step, on a real Redis, same explicit clock.

Hypothesis draws the scenarios (tests/strategies.py); ticks are microseconds around
today's epoch, the unit the Redis store counts in. Each hit and each peek must give
the same (allowed, remaining, reset_after, retry_after).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given

from ratewarden.algorithms import Algorithm, Params, State, peek
from ratewarden.stores.redis.scripts import Scripts, pack, script_args
from tests.models import ALGOS
from tests.redis_server import RedisCluster, RedisServer
from tests.strategies import Scenario, scenarios

EPOCH_US = 1_763_700_000_000_000  # 2025-11-21 in microseconds: realistic magnitudes


def run(scripts: Scripts, algorithm: Algorithm, *args: Any) -> list[int]:
    """The algorithm's script on (key, packed, now, cost, mode)."""
    return scripts.call(algorithm.step.__name__, 1, script_args(*args))  # type: ignore[no-any-return]


def as_ticks(allowed: bool, remaining: int, reset: float, retry: float) -> tuple[int, ...]:
    return (int(allowed), remaining, int(reset), -1 if math.isinf(retry) else int(retry))


@pytest.fixture(scope="module", params=["single", "cluster"])
def scripts(request: pytest.FixtureRequest) -> Iterator[Scripts]:
    """The scripts on a single node, and on a real 6-node cluster (keys spread over
    all three masters)."""
    client: redis.Redis | redis.RedisCluster
    if request.param == "single":
        server: RedisServer = request.getfixturevalue("redis_single")
        client = server.client()
    else:
        cluster: RedisCluster = request.getfixturevalue("redis_6_nodes")
        client = cluster.client()
    with client:
        yield Scripts(client)


@pytest.mark.parametrize("name", list(ALGOS))
@given(sc=scenarios())
def test_lua_equals_python(name: str, sc: Scenario, scripts: Scripts) -> None:
    algorithm = ALGOS[name]
    burst = sc.burst if algorithm.uses_burst else sc.limit
    params = Params.build(sc.limit, sc.period, burst=burst, tick=1.0)
    key = f"parity:{uuid.uuid4()}"
    state: State | None = None
    now = EPOCH_US + sc.start
    for gap, cost in sc.events:
        now += gap
        seen = peek(algorithm.step, state, now, cost, params)
        lua_seen = run(scripts, algorithm, key, pack(params), now, cost, "peek")
        assert tuple(lua_seen) == as_ticks(
            seen.allowed, seen.remaining, seen.reset_after, seen.retry_after
        ), f"peek at {now}, cost {cost}"
        decision, state = algorithm.step(state, now, cost, params)
        lua = run(scripts, algorithm, key, pack(params), now, cost, "hit")
        assert tuple(lua) == as_ticks(
            decision.allowed, decision.remaining, decision.reset_after, decision.retry_after
        ), f"hit at {now}, cost {cost}"


def test_large_values_stay_exact(scripts: Scripts) -> None:
    """1000/day with 7/second-style uneven intervals, at the real epoch: no rounding."""
    for name in ("token_bucket", "sliding_window_counter", "fixed_window"):
        algorithm = ALGOS[name]
        params = Params.build(7, 1_000_000, tick=1.0)  # 7 per second, in microseconds
        key = f"exact:{uuid.uuid4()}"
        state: State | None = None
        now = EPOCH_US + 123_457
        for step in range(40):
            now += 142_857 if step % 3 else 1
            decision, state = algorithm.step(state, now, 1, params)
            lua = run(scripts, algorithm, key, pack(params), now, 1, "hit")
            assert tuple(lua) == as_ticks(
                decision.allowed, decision.remaining, decision.reset_after, decision.retry_after
            )


@pytest.mark.parametrize("name", list(ALGOS))
@given(sc=scenarios(max_events=15))
def test_lua_in_millisecond_ticks(name: str, sc: Scenario, scripts: Scripts) -> None:
    """A limit too large for microseconds counts in milliseconds: the script turns
    its microsecond clock into ticks exactly as floor division does."""
    algorithm = ALGOS[name]
    burst = sc.burst if algorithm.uses_burst else sc.limit
    params = Params.build(sc.limit, sc.period, burst=burst, tick=1.0)
    key = f"parity-ms:{uuid.uuid4()}"
    state: State | None = None
    now_us = EPOCH_US + sc.start * 1000 + 777  # not on a tick boundary
    for gap, cost in sc.events:
        now_us += gap * 1000
        decision, state = algorithm.step(state, now_us // 1000, cost, params)
        lua = run(scripts, algorithm, key, pack(params, 1000), now_us, cost, "hit")
        assert tuple(lua) == as_ticks(
            decision.allowed, decision.remaining, decision.reset_after, decision.retry_after
        )

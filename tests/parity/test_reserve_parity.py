"""Each algorithm's reservation script (``_reserve.lua`` after ``_settle.lua``)
against the pure Python step and settle, on a real Redis, same explicit clock:
the same admissions and marks, and after every reserve, settle and cancel the
same state in the store (a full state and no key being the same)."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given

from ratewarden.algorithms import Params, State
from ratewarden.algorithms.settle import Change, settler
from ratewarden.stores.redis.scripts import RESERVE, Scripts, pack
from tests.models import ALGOS
from tests.parity.test_lua_parity import EPOCH_US, as_ticks
from tests.redis_server import RedisServer
from tests.strategies import SettleScenario, settle_scenarios


@pytest.fixture(scope="module")
def scripts(redis_single: RedisServer) -> Iterator[Scripts]:
    with redis_single.client() as client:
        yield Scripts(client)


def stored(client: Any, key: str) -> State | None:
    raw = client.get(key)
    if raw is None:
        return None
    return struct.unpack(f">{len(raw) // 8}d", raw)


def full(state: State | None, now: int) -> State | None:
    """None for a state that means the same as none (see algorithms._params)."""
    return None if state is None or state[0] <= now else tuple(map(int, state))


@pytest.mark.parametrize("name", list(ALGOS))
@given(sc=settle_scenarios(max_ops=20))
def test_lua_settles_as_python(name: str, sc: SettleScenario, scripts: Scripts) -> None:
    algorithm = ALGOS[name]
    burst = sc.burst if algorithm.uses_burst else sc.limit
    params = Params.build(sc.limit, sc.period, burst=burst, tick=1.0)
    packed, settle = pack(params), settler(algorithm.step)
    script = RESERVE + algorithm.step.__name__
    key = f"reserve-parity:{uuid.uuid4()}"
    state: State | None = None
    now = EPOCH_US + sc.start
    held: list[tuple[int, int]] = []  # (estimate, mark)
    for gap, what, amount, pick in sc.ops:
        now += gap
        if what == "reserve":
            if not amount:
                continue
            decision, state = algorithm.step(state, now, amount, params)
            mark = settle.mark(state, now, params) if decision.allowed else 0
            lua = scripts.call(script, 1, [key, now, "reserve", amount, packed])
            expected = as_ticks(
                decision.allowed, decision.remaining, decision.reset_after, decision.retry_after
            )
            assert tuple(lua) == (*expected, mark), f"reserve {amount} at {now}"
            if decision.allowed:
                held.append((amount, mark))
        elif held:
            estimate, mark = held.pop(pick % len(held))
            delta = -estimate if what == "cancel" else amount - estimate
            state = settle.settle(state, now, Change(delta, mark, estimate), params)
            args = [key, now, "settle", delta, packed, mark, estimate]
            assert scripts.call(script, 1, args) == 1
        assert full(stored(scripts.client, key), now) == full(state, now), f"{what} at {now}"


def test_a_bucket_in_debt_answers_as_python(scripts: Scripts) -> None:
    """The bucket's script reads a debt past its capacity as the step does: no
    tokens remain (never fewer), and the wait covers the debt."""
    algorithm = ALGOS["gcra"]
    params = Params.build(10, 1_000_000, tick=1.0)
    settle = settler(algorithm.step)
    key = f"reserve-debt:{uuid.uuid4()}"
    script, packed, now = RESERVE + "bucket", pack(params), EPOCH_US
    state: State | None = algorithm.step(None, now, 10, params)[1]
    assert scripts.call(script, 1, [key, now, "reserve", 10, packed])[0] == 1
    state = settle.settle(state, now, Change(5, now, 10), params)
    scripts.call(script, 1, [key, now, "settle", 5, packed, now, 10])
    for later in (now, now + 100_000, now + 550_000, now + 600_000):
        decision = algorithm.step(state, later, 1, params)[0]
        lua = scripts.call(script, 1, [key, later, "reserve", 1, packed])
        assert decision.remaining == 0 or later == now + 600_000
        assert tuple(lua[:4]) == as_ticks(
            decision.allowed, decision.remaining, decision.reset_after, decision.retry_after
        )
        if decision.allowed:
            break

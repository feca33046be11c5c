"""Multi-tier checks: every tier passes and counts, or none counts."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given

from ratewarden import (
    Adaptive,
    AsyncLimiter,
    AsyncMemoryStore,
    ConfigurationError,
    Decision,
    FakeClock,
    Limiter,
    MemoryStore,
    ahit_many,
    hit_many,
)
from ratewarden._hitmany import hit_tiers
from ratewarden.algorithms import Params, State, Step, get_algorithm, peek
from ratewarden.stores.base import pick
from tests.strategies import TierSpec, TiersScenario, tier_scenarios


def remaining(limiter: Limiter, key: str) -> tuple[int, float]:
    seen = limiter.peek(key)
    return seen.remaining, seen.reset_after


def test_denied_request_counts_nowhere() -> None:
    store = MemoryStore(clock=FakeClock())
    second = Limiter("3/second", algorithm="fixed_window", store=store, name="second")
    minute = Limiter("5/minute", algorithm="sliding_window_log", store=store, name="minute")
    tiers = [(second, "u"), (minute, "u")]
    assert [hit_many(tiers).allowed for _ in range(4)] == [True, True, True, False]
    denied = hit_many(tiers)
    assert denied.rule == "second"
    assert remaining(second, "u")[0] == 0
    assert remaining(minute, "u")[0] == 2
    store.clock.advance(1.0)  # type: ignore[attr-defined]
    assert [hit_many(tiers).allowed for _ in range(3)] == [True, True, False]
    denied = hit_many(tiers)
    assert denied.rule == "minute"  # the second would pass; the minute is spent
    assert remaining(second, "u")[0] == 1  # the denied requests took nothing from it


def test_decision_is_the_longest_wait_or_the_tightest_tier() -> None:
    store = MemoryStore(clock=FakeClock(1_700_000_040))  # on a minute's edge
    per_second = Limiter("2/second", algorithm="fixed_window", store=store, name="s")
    per_minute = Limiter("3/minute", algorithm="fixed_window", store=store, name="m")
    both = [(per_second, "k"), (per_minute, "k")]
    assert hit_many(both).rule == "s"  # 1/2 left is tighter than 2/3
    store.clock.advance(1.0)  # type: ignore[attr-defined]
    assert hit_many(both).rule == "m"  # 1/3 left is tighter than 1/2
    assert hit_many(both).rule == "s"  # nothing left in either: the earlier tier
    denied = hit_many(both)  # both deny: the minute waits longest
    assert not denied.allowed
    assert denied.rule == "m"
    assert denied.retry_after == pytest.approx(59.0)


def test_a_tier_that_repeats_counts_twice() -> None:
    store = MemoryStore(clock=FakeClock())
    limiter = Limiter("5/minute", algorithm="token_bucket", store=store, name="t")
    assert hit_many([(limiter, "k", 2), (limiter, "k", 2)]).remaining == 1
    assert not hit_many([(limiter, "k", 1), (limiter, "k", 1)])  # 1 + 1 > 1
    assert limiter.peek("k").remaining == 1  # and the first half was undone
    assert len(store) == 1


def test_cost_no_tier_can_grant_is_denied_forever() -> None:
    store = MemoryStore(clock=FakeClock())
    small = Limiter("2/second", store=store, name="small")
    big = Limiter("100/second", store=store, name="big")
    denied = hit_many([(big, "k", 3), (small, "k", 3)])
    assert not denied.allowed
    assert math.isinf(denied.retry_after)
    assert denied.rule == "small"


def test_bad_calls_are_configuration_errors() -> None:
    store = MemoryStore()
    limiter = Limiter("5/minute", store=store)
    other = Limiter("5/minute")
    with pytest.raises(ConfigurationError, match="at least one"):
        hit_many([])
    with pytest.raises(ConfigurationError, match="one store"):
        hit_many([(limiter, "a"), (other, "a")])
    with pytest.raises(ConfigurationError, match="a check is"):
        hit_many([(limiter,)])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="starts with a limiter"):
        hit_many([("limiter", "a")])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="cost"):
        hit_many([(limiter, "a", 0)])
    assert len(store) == 0


def test_async_twin() -> None:
    async def main() -> list[Decision]:
        store = AsyncMemoryStore(clock=FakeClock())
        a = AsyncLimiter("2/second", store=store, name="a")
        b = AsyncLimiter("10/second", algorithm="gcra", store=store, name="b")
        return [await ahit_many([(a, "k"), (b, "k", 2)]) for _ in range(3)]

    assert [d.allowed for d in asyncio.run(main())] == [True, True, False]


def test_pick_breaks_ties_to_the_earlier_tier() -> None:
    a = Decision(False, 5, 0, 1.0, 1.0, "a")
    b = Decision(False, 5, 0, 1.0, 1.0, "b")
    assert pick([a, b]).rule == "a"
    c = Decision(True, 10, 5, 0.0, 0.0, "c")
    d = Decision(True, 4, 2, 0.0, 0.0, "d")
    assert pick([c, d]).rule == "c"


def reference(spec: TierSpec, limiter: Limiter) -> tuple[Step, Params]:
    """The pure step and params behind a tier, in the memory store's nanoseconds."""
    algorithm, _, refill = spec.algorithm.partition("/")
    step = get_algorithm(algorithm, refill="interval" if refill else "continuous").step
    params = Params.build(
        spec.limit, spec.period_ms * 1_000_000, burst=spec.burst, rule=limiter.name
    )
    return step, params


@pytest.mark.parametrize("max_keys", [None, 3])
@given(sc=tier_scenarios())
def test_memory_store_equals_sequential_steps(max_keys: int | None, sc: TiersScenario) -> None:
    """Against a reference that steps each tier from the state the tiers before it
    left and keeps the new states only if all passed; every tier's state then
    matches the reference's (without a bound, which may evict), and the store's
    count of keys matches its tables."""
    clock = FakeClock()
    store = MemoryStore(max_keys=max_keys, clock=clock)
    limiters = [spec.limiter(store) for spec in sc.tiers]
    steps = [reference(spec, limiter) for spec, limiter in zip(sc.tiers, limiters, strict=True)]
    where = [(lim.key_prefix, spec.key) for lim, spec in zip(limiters, sc.tiers, strict=True)]
    states: dict[tuple[str, str], State] = {}
    for gap, costs in sc.events:
        clock.advance(gap / 1000)
        trial = dict(states)
        expected = []
        for (step, params), at, cost in zip(steps, where, costs, strict=True):
            decision, new = step(trial.get(at), clock.now_ns, cost, params)
            expected.append(decision)
            if decision.allowed:
                trial[at] = new
        checks = [
            (lim, spec.key, c) for lim, spec, c in zip(limiters, sc.tiers, costs, strict=True)
        ]
        assert hit_many(checks) == pick(expected)
        if all(expected):
            states = trial
        assert len(store) == sum(len(table) for table in store._tables.values())
        if max_keys is None:
            for limiter, spec, (step, params), at in zip(
                limiters, sc.tiers, steps, where, strict=True
            ):
                assert limiter.peek(spec.key) == peek(step, states.get(at), clock.now_ns, 1, params)
        else:
            assert len(store) <= max(max_keys, len(set(where)))


def test_shadow_tiers_count_only_behind_an_admitted_request() -> None:
    store = MemoryStore(clock=FakeClock())
    enforced = Limiter("2/minute", algorithm="fixed_window", store=store, name="enforced")
    wide = Limiter("10/minute", algorithm="fixed_window", store=store, name="wide")
    narrow = Limiter("1/minute", algorithm="fixed_window", store=store, name="narrow")
    shadow = [(wide, "k", 1), (narrow, "k", 1)]
    first = hit_tiers([(enforced, "k", 1)], shadow)
    assert first[0] is not None
    assert first[0].allowed
    assert first[1] is not None
    assert first[1].allowed
    second = hit_tiers([(enforced, "k", 1)], shadow)
    assert second[0] is not None
    assert second[0].allowed
    assert second[1] is not None
    assert second[1].rule == "narrow"
    assert not second[1].allowed
    assert wide.peek("k").remaining == 9  # all or nothing among the shadow tiers
    third = hit_tiers([(enforced, "k", 1)], shadow)
    assert third[0] is not None
    assert not third[0].allowed
    assert third[1] is None  # denied: the shadow tiers are not checked
    alone = hit_tiers([], [(wide, "j", 1)])  # no enforced tier: shadow counts
    assert alone[0] is None
    assert alone[1] is not None
    assert alone[1].remaining == 9
    with pytest.raises(ConfigurationError, match="at least one"):
        hit_tiers([], [])


def test_a_limiter_tells_what_a_multi_limit_check_needs_of_it() -> None:
    store = MemoryStore(clock=FakeClock())
    plain = Limiter("10/second", store=store, name="plain")
    tier = plain.tier("k", 3)
    assert tier[1:] == (False, None, (10, 10))
    assert tier.check[1:] == ("k", 3)
    assert store.hit_many([tier.check]).remaining == 7  # the store's own check
    sharded = Limiter("10/second", store=store, shards=2).tier("k")
    assert (sharded.sharded, sharded.limits) == (True, (10, 5))
    # an adaptive limit counts in units (1000 a request at the full limit)
    busy = Limiter("10/second", store=store, algorithm="fixed_window",
                   adaptive=Adaptive(lambda: 0.0, good=200, bad=1000))  # fmt: skip
    priced = busy.tier("k", 2)
    assert (priced.price, priced.check[2], priced.limits) == (1000, 2000, (10_000, 10_000))
    assert AsyncLimiter("10/second").tier("k")[1:] == (False, None, (10, 10))

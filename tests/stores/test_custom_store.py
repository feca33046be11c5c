"""A store written as a third party would write it, from the public API alone
(`ratewarden`, `ratewarden.stores`, `ratewarden.algorithms`), driven through
`Limiter`, `hit_many`, a sharded limit and the rule engine. tests/typing/api.py
checks the same stores against the `Store` and `AsyncStore` protocols."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Unpack

import pytest

from ratewarden import (
    ALGORITHMS,
    AsyncLimiter,
    Clock,
    ConfigurationError,
    Decision,
    FakeClock,
    Limiter,
    MemoryStore,
    Rate,
    StoreUnavailable,
    ahit_many,
    hit_many,
)
from ratewarden.algorithms import Algorithm, Params, State, Step, peek
from ratewarden.rules import RuleEngine, loads
from ratewarden.stores import (
    Answers,
    AsyncBound,
    BindOptions,
    Bound,
    Check,
    OnFailure,
    check_cost,
    fallback,
    pick,
)


@dataclass(frozen=True)
class DictTier:
    """One limit in a `DictStore`: what ``hit_many`` gets back in its checks."""

    states: dict[str, State]
    step: Step
    params: Params


class DictStore:
    """Counts in one dict per limit, each check under one lock: the whole protocol
    and nothing else (no eviction: a real store would drop states that are full
    again, whose element 0 has passed)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.limits: dict[str, dict[str, State]] = {}  # by the limit's prefix
        self.lock = threading.Lock()
        self.closed = False

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound:
        params = Params.build(
            rate.limit, rate.period_ns, burst=options["burst"], rule=options["rule"]
        )
        # one prefix, one limit: a second bind of it shares its counters
        tier = DictTier(self.limits.setdefault(options["prefix"], {}), algorithm.step, params)

        def hit(key: str, cost: int = 1) -> Decision:
            return self.hit_many([(tier, key, cost)])

        def peek_(key: str, cost: int = 1) -> Decision:
            check_cost(cost)
            state = tier.states.get(key)  # one read; the rest is pure
            return peek(tier.step, state, self.clock.time_ns(), cost, tier.params)

        def reset(key: str) -> None:
            with self.lock:
                tier.states.pop(key, None)

        return Bound(hit, peek_, reset, tier)

    def hit_many(self, checks: Sequence[Check]) -> Decision:
        for _, _, cost in checks:
            check_cost(cost)
        now = self.clock.time_ns()
        with self.lock:
            return self._step_all(checks, now)

    def hit_tiers(self, checks: Sequence[Check], shadow: Sequence[Check]) -> Answers:
        for _, _, cost in (*checks, *shadow):
            check_cost(cost)
        now = self.clock.time_ns()
        with self.lock:  # both sides in one hold: nothing counts in between
            decision = self._step_all(checks, now) if checks else None
            if shadow and (decision is None or decision.allowed):
                return decision, self._step_all(shadow, now)
            return decision, None

    def close(self) -> None:
        self.closed = True

    def _step_all(self, checks: Sequence[Check], now: int) -> Decision:
        """Step every tier; keep the new states only if all passed. A key in two
        tiers steps the second time from the state the first left."""
        decisions: list[Decision] = []
        staged: dict[tuple[int, str], tuple[dict[str, State], State]] = {}
        for tier, key, cost in checks:
            states: dict[str, State] = tier.states
            slot = (id(states), key)
            state = staged[slot][1] if slot in staged else states.get(key)
            decision, new = tier.step(state, now, cost, tier.params)
            decisions.append(decision)
            if decision.allowed:
                staged[slot] = (states, new)
        if all(decision.allowed for decision in decisions):
            for (_, key), (states, new) in staged.items():
                states[key] = new
        return pick(decisions)


class AsyncDictStore:
    """The asyncio twin: the same counts, every call awaited."""

    def __init__(self, clock: Clock) -> None:
        self.sync = DictStore(clock)
        self.clock = clock

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> AsyncBound:
        sync_hit, sync_peek, sync_reset, tier = self.sync.bind(algorithm, rate, **options)

        async def hit(key: str, cost: int = 1) -> Decision:
            return sync_hit(key, cost)

        async def peek_(key: str, cost: int = 1) -> Decision:
            return sync_peek(key, cost)

        async def reset(key: str) -> None:
            sync_reset(key)

        return AsyncBound(hit, peek_, reset, tier)

    async def hit_many(self, checks: Sequence[Check]) -> Decision:
        return self.sync.hit_many(checks)

    async def hit_tiers(self, checks: Sequence[Check], shadow: Sequence[Check]) -> Answers:
        return self.sync.hit_tiers(checks, shadow)

    async def aclose(self) -> None:
        self.sync.close()


class DownStore(DictStore):
    """A store whose server is down: it answers by each limit's failure policy."""

    def bind(self, algorithm: Algorithm, rate: Rate, **options: Unpack[BindOptions]) -> Bound:
        bound = super().bind(algorithm, rate, **options)
        policy: OnFailure = options["on_failure"]
        size = rate.limit if options["burst"] is None else options["burst"]

        def hit(key: str, cost: int = 1) -> Decision:
            check_cost(cost)
            error = StoreUnavailable("the counting server does not answer")
            return fallback(policy, size, options["rule"], 1.0, error)

        return bound._replace(hit=hit)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_a_limiter_counts_in_the_custom_store(clock: FakeClock) -> None:
    store = DictStore(clock)
    api = Limiter("3/minute", algorithm="token_bucket", store=store, name="api")
    told = [api.hit("u1") for _ in range(4)]
    assert [d.allowed for d in told] == [True, True, True, False]
    assert [d.remaining for d in told] == [2, 1, 0, 0]
    assert told[3].retry_after == pytest.approx(20.0)  # one token per 20 s
    assert told[3].rule == "api"
    assert api.peek("u1").allowed is False
    assert api.hit("u2").allowed  # another key, its own bucket
    clock.advance(20)
    assert api.peek("u1") == Decision(True, 3, 1, 40.0, 0.0, "api")  # counts nothing
    assert api.hit("u1").allowed
    assert not api.hit("u1").allowed
    api.reset("u1")
    assert api.hit("u1").remaining == 2
    assert store.limits[api.key_prefix].keys() == {"u1", "u2"}


def test_costs_are_checked_and_a_cost_past_the_limit_is_denied(clock: FakeClock) -> None:
    api = Limiter("3/minute", store=DictStore(clock))
    with pytest.raises(ConfigurationError, match="cost must be a positive integer"):
        api.hit("u1", 0)
    too_big = api.hit("u1", 4)
    assert not too_big.allowed
    assert too_big.retry_after == float("inf")
    assert api.hit("u1", 3).allowed  # the refused cost counted nothing


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_the_custom_store_agrees_with_the_memory_store(algorithm: str) -> None:
    """Both apply the same step functions: every Decision the same, cost by cost."""
    clock = FakeClock()
    ours = Limiter("5/10seconds", algorithm=algorithm, store=DictStore(clock), name="x")
    reference = Limiter(
        "5/10seconds", algorithm=algorithm, store=MemoryStore(clock=clock), name="x"
    )
    for step in range(60):
        cost = 1 + step % 3
        assert ours.hit("k", cost) == reference.hit("k", cost), step
        assert ours.peek("k") == reference.peek("k"), step
        clock.advance(0.7)


def test_hit_many_admits_only_if_every_tier_passes(clock: FakeClock) -> None:
    store = DictStore(clock)
    per_user = Limiter("2/minute", algorithm="gcra", store=store, name="per-user")
    per_org = Limiter("3/minute", algorithm="gcra", store=store, name="per-org")
    first = hit_many([(per_user, "u1"), (per_org, "acme")])
    assert first.allowed
    assert (first.rule, first.remaining) == ("per-user", 1)  # the least room, relatively
    assert hit_many([(per_user, "u1"), (per_org, "acme")]).allowed
    denied = hit_many([(per_user, "u1"), (per_org, "acme")])
    assert not denied.allowed
    assert denied.rule == "per-user"
    assert denied.retry_after == pytest.approx(30.0)
    assert per_org.peek("acme").remaining == 1  # the denied request counted nowhere
    # one key in two tiers steps twice: the second time from the first's new state
    assert not hit_many([(per_org, "acme"), (per_org, "acme")]).allowed
    assert per_org.peek("acme").remaining == 1


def test_a_sharded_limit_spreads_over_the_custom_store(clock: FakeClock) -> None:
    store = DictStore(clock)
    hot = Limiter("4/minute", algorithm="fixed_window", shards=2, store=store, name="hot")
    told = [hot.hit("{k}") for _ in range(5)]
    assert [d.allowed for d in told] == [True] * 4 + [False]
    assert all(d.limit == 4 for d in told)
    assert sum(len(states) for states in store.limits.values()) == 2  # one key per shard


def test_a_failure_policy_answers_when_the_store_cannot(clock: FakeClock) -> None:
    store = DownStore(clock)
    opened = Limiter("3/minute", store=store, on_failure="fail_open").hit("k")
    assert opened.allowed
    assert opened.degraded
    closed = Limiter("3/minute", store=store, on_failure="fail_closed").hit("k")
    assert not closed.allowed
    assert closed.degraded
    assert closed.retry_after == 1.0
    with pytest.raises(StoreUnavailable, match="does not answer"):
        Limiter("3/minute", store=store).hit("k")


RULES = """
rules:
  - name: per-user
    rate: 2/30seconds
    algorithm: token_bucket
    by: user
  - name: watch
    rate: 3/minute
    algorithm: fixed_window
    by: user
    action: log_only
"""


def test_the_rule_engine_runs_on_the_custom_store(clock: FakeClock) -> None:
    clock.set(1_700_000_040)  # the start of a minute: one fixed window all along
    store = DictStore(clock)
    engine = RuleEngine(loads(RULES), store)
    outcomes = [engine.check({"user": "u1"}) for _ in range(3)]
    assert [o.status for o in outcomes] == [200, 200, 429]
    first, _, denied = outcomes
    assert first.decision == Decision(True, 2, 1, 15.0, 0.0, "per-user")
    assert first.shadow == Decision(True, 3, 2, 60.0, 0.0, "watch")
    assert denied.rule is not None
    assert denied.rule.name == "per-user"
    assert denied.retry_after == pytest.approx(15.0)
    clock.advance(15)
    # the denied request counted in no tier, the log_only one included
    assert engine.check({"user": "u1"}).shadow == Decision(True, 3, 0, 45.0, 0.0, "watch")
    clock.advance(15)
    over = engine.check({"user": "u1"})
    assert over.allowed  # the log_only rule would deny: it counts, and never denies
    assert over.shadow is not None
    assert not over.shadow.allowed
    assert engine.check({"user": "u2"}).allowed
    engine.close()
    store.close()
    assert store.closed


def test_the_async_twin_serves_an_async_limiter(clock: FakeClock) -> None:
    async def main() -> None:
        store = AsyncDictStore(clock)
        api = AsyncLimiter("2/minute", algorithm="token_bucket", store=store, name="api")
        org = AsyncLimiter("1/minute", algorithm="token_bucket", store=store, name="org")
        assert (await org.hit("acme")).remaining == 0
        denied = await ahit_many([(api, "u1"), (org, "acme")])
        assert not denied.allowed
        assert denied.rule == "org"
        assert (await api.peek("u1")).remaining == 2  # counted nowhere
        told = [await api.hit("u1") for _ in range(3)]
        assert [d.allowed for d in told] == [True, True, False]
        assert told[2].retry_after == pytest.approx(30.0)
        await api.reset("u1")
        assert (await api.hit("u1")).remaining == 1
        await store.aclose()
        assert store.sync.closed

    asyncio.run(main())

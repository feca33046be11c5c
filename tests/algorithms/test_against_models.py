"""Every algorithm against its naive model, on random scenarios with explicit ticks."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given

from ratewarden.algorithms import Algorithm, Params, State, peek
from tests.models import ALGOS, MODELS, Model
from tests.strategies import Scenario, scenarios

PARAM = pytest.mark.parametrize("name", list(MODELS))


def setup(name: str, sc: Scenario) -> tuple[Algorithm, Params, Model]:
    algorithm = ALGOS[name]
    burst = sc.burst if algorithm.uses_burst else sc.limit
    params = Params.build(sc.limit, sc.period, burst=burst, tick=1.0)
    return algorithm, params, MODELS[name](sc.limit, sc.period, burst)


def run(name: str, sc: Scenario) -> tuple[Algorithm, Params, Model, list[tuple[int, State]]]:
    """Drive the algorithm and the model through the scenario; they must agree."""
    algorithm, params, model = setup(name, sc)
    state: State | None = None
    now = sc.start
    trace: list[tuple[int, State]] = []
    for gap, cost in sc.events:
        now += gap
        decision, state = algorithm.step(state, now, cost, params)
        allowed, remaining, retry, reset = model.hit(now, cost)
        got = (decision.allowed, decision.remaining, decision.retry_after, decision.reset_after)
        assert got == (allowed, remaining, retry, reset), f"at tick {now}, cost {cost}"
        assert decision.limit == (params.burst if algorithm.uses_burst else params.limit)
        trace.append((now, state))
    return algorithm, params, model, trace


@PARAM
@given(sc=scenarios())
def test_decisions_equal_the_naive_model(name: str, sc: Scenario) -> None:
    run(name, sc)


@PARAM
@given(sc=scenarios())
def test_peek_reports_the_state_as_it_stands(name: str, sc: Scenario) -> None:
    algorithm, params, model = setup(name, sc)
    state: State | None = None
    now = sc.start
    for gap, cost in sc.events:
        now += gap
        seen = peek(algorithm.step, state, now, cost, params)
        allowed = model.allows(now, cost)
        retry = 0 if allowed else model.first_pass(now, cost)
        expected = (allowed, model.remaining(now), retry, model.reset_after(now))
        assert (seen.allowed, seen.remaining, seen.retry_after, seen.reset_after) == expected
        _decision, state = algorithm.step(state, now, cost, params)
        model.hit(now, cost)


@PARAM
@given(sc=scenarios())
def test_never_more_than_promised(name: str, sc: Scenario) -> None:
    _, params, model, _ = run(name, sc)
    history, limit, period, burst = model.history, params.limit, params.period, params.burst
    times = sorted({t for t, _ in history})
    if name in ("fixed_window", "sliding_window_counter"):
        # at most `limit` in any epoch-aligned window
        for t in times:
            start = t // period * period
            assert model.in_window(start, start + period) <= limit
    elif name == "sliding_window_log":
        for t in times:  # any window (t - period, t]
            assert model.in_window(t - period + 1, t + 1) <= limit
    elif name == "token_bucket(interval)":
        for t in times:  # a period starts at some admission: burst at most from there
            assert model.in_window(t, t + period) <= burst or any(
                s for s in times if t < s < t + period
            )
    else:  # buckets: in any [a, b], at most burst + (b - a) * limit / period
        for a in times:
            for b in times:
                if b >= a:
                    assert model.in_window(a, b + 1) <= burst + Fraction((b - a) * limit, period)


@PARAM
@given(sc=scenarios())
def test_retry_after_is_exact(name: str, sc: Scenario) -> None:
    """A denied request passes at exactly now + retry_after, and not one tick before."""
    algorithm, params, _, trace = run(name, sc)
    prior: State | None = None
    for (now, state), (_, cost) in zip(trace, sc.events, strict=True):
        decision, _ = algorithm.step(prior, now, cost, params)
        if not decision.allowed and math.isfinite(decision.retry_after):
            at = now + int(decision.retry_after)
            assert algorithm.step(prior, at, cost, params)[0].allowed
            assert not algorithm.step(prior, at - 1, cost, params)[0].allowed
        prior = state


@PARAM
@given(sc=scenarios())
def test_reset_after_means_whole_again(name: str, sc: Scenario) -> None:
    """At now + reset_after the limit is whole (a full-capacity request passes) and the
    state is ``full`` (element 0 has passed), so a store may drop it."""
    algorithm, params, _, trace = run(name, sc)
    capacity = params.burst if algorithm.uses_burst else params.limit
    for now, state in trace:
        peek, _ = algorithm.step(state, now, 1, params)
        at = now + int(peek.reset_after)
        assert state[0] <= max(at, now) or peek.reset_after > 0
        if peek.reset_after:
            assert state[0] <= at
            assert algorithm.step(state, at, capacity, params)[0].allowed


@PARAM
@given(sc=scenarios())
def test_a_full_state_is_the_same_as_none(name: str, sc: Scenario) -> None:
    algorithm, params, _, trace = run(name, sc)
    for _, state in trace:
        later = state[0] + 1 + sc.period
        for cost in (1, params.limit, params.burst):
            assert (
                algorithm.step(state, later, cost, params)[0]
                == (algorithm.step(None, later, cost, params)[0])
            )


@PARAM
@given(sc=scenarios())
def test_cost_n_is_n_hits_of_cost_1(name: str, sc: Scenario) -> None:
    algorithm, params, _, trace = run(name, sc)
    for now, state in trace:
        for n in range(1, params.burst + 2):
            whole, _ = algorithm.step(state, now, n, params)
            s: State | None = state
            singles = []
            for _ in range(n):
                d, s = algorithm.step(s, now, 1, params)
                singles.append(d.allowed)
            if whole.allowed:
                assert all(singles)
                assert d.remaining == whole.remaining
            else:
                assert not all(singles)


@PARAM
def test_a_cost_beyond_capacity_is_denied_forever(name: str) -> None:
    algorithm = ALGOS[name]
    params = Params.build(5, 10, burst=5, tick=1.0)
    decision, state = algorithm.step(None, 1000, 6, params)
    assert not decision.allowed
    assert decision.retry_after == math.inf
    assert decision.reason is not None
    assert "can ever grant" in decision.reason
    assert state[0] <= 1000  # nothing was counted: the state is full at once


@PARAM
def test_nanosecond_ticks_at_the_real_epoch(name: str) -> None:
    """Realistic magnitudes: 7 per second (an emission interval that is no whole number
    of nanoseconds) around today's epoch in ns; exact to the nanosecond."""
    algorithm = ALGOS[name]
    params = Params.build(7, 1_000_000_000, tick=1e-9)
    model = MODELS[name](7, 1_000_000_000, 7)
    now = 1_763_700_000_123_456_789
    state: State | None = None
    for _ in range(9):
        decision, state = algorithm.step(state, now, 1, params)
        assert decision.allowed == model.allows(now, 1)
        if decision.allowed:
            model.history.append((now, 1))
    assert not decision.allowed
    retry = round(decision.retry_after * 1e9)
    assert algorithm.step(state, now + retry, 1, params)[0].allowed
    assert not algorithm.step(state, now + retry - 1, 1, params)[0].allowed

"""Settling reservations in the pure step functions (`ratewarden.algorithms.settle`):
the state stays one the step reads correctly, a refund never fills a limit past
whole, and what is charged is what was settled plus the estimates still held."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given

from ratewarden.algorithms import Algorithm, Params, State, peek
from ratewarden.algorithms.calendar import Calendar
from ratewarden.algorithms.settle import Change, settler
from tests.models import ALGOS
from tests.strategies import SettleScenario, settle_scenarios

PARAM = pytest.mark.parametrize("name", list(ALGOS))


@dataclass
class Held:
    estimate: int
    mark: int
    at: int  # the tick it was reserved at


def setup(name: str, sc: SettleScenario) -> tuple[Algorithm, Params]:
    algorithm = ALGOS[name]
    burst = sc.burst if algorithm.uses_burst else sc.limit
    return algorithm, Params.build(sc.limit, sc.period, burst=burst, tick=1.0)


def drive(
    name: str, sc: SettleScenario, check: object = None, *, model: bool = False
) -> tuple[State | None, int, int]:
    """Run the scenario; return the final state, the tick, and what the naive
    model of a single tick says is charged (settled actuals, clamped as each
    algorithm clamps, plus the estimates still held). ``model``: every op is at
    one tick, and each admission must be the model's."""
    algorithm, params = setup(name, sc)
    settle = settler(algorithm.step)
    size = params.burst if algorithm.uses_burst else params.limit
    most = 2 * size if algorithm.step.__name__ == "bucket" else size
    state: State | None = None
    now, used = sc.start, 0
    held: list[Held] = []
    for gap, what, amount, pick in sc.ops:
        now += gap
        if what == "reserve":
            if amount == 0:
                continue
            decision, new = algorithm.step(state, now, amount, params)
            if model:
                assert decision.allowed == (used + amount <= size)
            if decision.allowed:
                held.append(Held(amount, settle.mark(new, now, params), now))
                used += amount
            state = new
        elif held:
            r = held.pop(pick % len(held))
            delta = -r.estimate if what == "cancel" else amount - r.estimate
            state = settle.settle(state, now, Change(delta, r.mark, r.estimate), params)
            used = min(used + delta, most) if delta > 0 else max(used + delta, 0)
        if callable(check):
            check(algorithm, params, state, now)
    return state, now, used


def valid(algorithm: Algorithm, p: Params, state: State | None, now: int) -> None:
    """The state is one the step reads correctly: counts within the limit and
    never below zero, a bucket never fuller than its capacity (in debt down to
    -burst at most), and its Decisions within [0, size]."""
    size = p.burst if algorithm.uses_burst else p.limit
    if state is not None:
        kind = algorithm.step.__name__
        if kind == "fixed_window":
            assert 0 <= state[1] <= p.limit
        elif kind == "sliding_window_counter":
            assert 0 <= state[1] <= p.limit
            assert 0 <= state[2] <= p.limit
        elif kind == "sliding_window_log":
            entries = state[1:]
            assert list(entries) == sorted(entries)
            assert len(entries) <= p.limit
            assert state[0] == (entries[-1] if entries else state[0])
        elif kind == "bucket":
            assert 0 <= state[1] < p.scale
            debt = max((state[0] - now) * p.scale - state[1], 0)
            assert debt <= 2 * p.capacity
        else:
            assert 0 <= state[1] <= p.burst
    seen = peek(algorithm.step, state, now, 1, p)
    assert 0 <= seen.remaining <= size
    assert seen.reset_after >= 0


@PARAM
@given(sc=settle_scenarios())
def test_the_state_stays_valid(name: str, sc: SettleScenario) -> None:
    drive(name, sc, valid)


@PARAM
@given(sc=settle_scenarios(same_tick=True))
def test_charged_is_settled_plus_held_estimates(name: str, sc: SettleScenario) -> None:
    """At one tick (nothing refills, no window passes) the limit's remaining is
    its size less the naive model's charge: each settle's actual, each held
    estimate, clamped where each algorithm documents a clamp."""
    algorithm, params = setup(name, sc)
    size = params.burst if algorithm.uses_burst else params.limit
    state, now, used = drive(name, sc, model=True)
    assert peek(algorithm.step, state, now, 1, params).remaining == max(size - used, 0)


@PARAM
@given(sc=settle_scenarios(same_tick=True, big=True))
def test_no_clamp_charged_is_exactly_settled_plus_held(name: str, sc: SettleScenario) -> None:
    """With a limit no run reaches, the sum charged is exactly the sum settled
    plus the estimates of the reservations not settled."""
    algorithm, params = setup(name, sc)
    settle = settler(algorithm.step)
    state: State | None = None
    now = sc.start
    held: list[Held] = []
    settled = 0
    for _, what, amount, pick in sc.ops:
        if what == "reserve" and amount:
            decision, state = algorithm.step(state, now, amount, params)
            assert decision.allowed
            held.append(Held(amount, settle.mark(state, now, params), now))
        elif what != "reserve" and held:
            r = held.pop(pick % len(held))
            actual = 0 if what == "cancel" else amount
            state = settle.settle(
                state, now, Change(actual - r.estimate, r.mark, r.estimate), params
            )
            settled += actual
    charged = params.limit - peek(algorithm.step, state, now, 1, params).remaining
    assert charged == settled + sum(r.estimate for r in held)


def must(state: State | None) -> State:
    assert state is not None
    return state


def one(name: str, limit: int = 10, period: int = 100) -> tuple[Algorithm, Params]:
    algorithm = ALGOS[name]
    return algorithm, Params.build(limit, period, tick=1.0)


@PARAM
def test_a_refund_after_the_window_passed_is_void(name: str) -> None:
    """Reserved 8 at tick 10, refunded 6 at tick 250 (the window of tick 10 and
    the next have passed): what others counted since is left as it is. A
    continuous bucket has no window: its 8 tokens refilled in 80 ticks, and
    what of them had not drained is all it could give back."""
    algorithm, p = one(name)
    settle = settler(algorithm.step)
    _, state = algorithm.step(None, 10, 8, p)
    mark = settle.mark(state, 10, p)
    _, state = algorithm.step(state, 240, 3, p)  # someone else, in a later window
    before = peek(algorithm.step, state, 250, 1, p).remaining
    after_state = settle.settle(state, 250, Change(-6, mark, 8), p)
    assert peek(algorithm.step, after_state, 250, 1, p).remaining == before


@PARAM
def test_a_refund_in_its_window_gives_back_and_no_more(name: str) -> None:
    algorithm, p = one(name)
    settle = settler(algorithm.step)
    _, state = algorithm.step(None, 10, 8, p)
    mark = settle.mark(state, 10, p)
    state = must(settle.settle(state, 10, Change(-5, mark, 8), p))
    assert peek(algorithm.step, state, 10, 1, p).remaining == 7
    state = must(settle.settle(state, 10, Change(-50, mark, 8), p))  # more than was ever taken
    assert peek(algorithm.step, state, 10, 1, p).remaining == 10


@pytest.mark.parametrize("name", ["token_bucket", "gcra", "leaky_bucket"])
def test_a_bucket_refunds_what_has_not_drained(name: str) -> None:
    """10 per 100 ticks (a token refills every 10 ticks): 8 reserved at tick 0,
    cancelled at tick 30, after 3 tokens refilled: 5 come back, not 8, so a
    later hit's tokens are not given away (this one's refill went first)."""
    algorithm, p = one(name)
    settle = settler(algorithm.step)
    _, state = algorithm.step(None, 0, 8, p)
    mark = settle.mark(state, 0, p)
    _, state = algorithm.step(state, 30, 4, p)  # someone else: 10 - 8 + 3 - 4 = 1 left
    state = must(settle.settle(state, 30, Change(-8, mark, 8), p))
    assert peek(algorithm.step, state, 30, 1, p).remaining == 6


def test_a_bucket_in_debt_denies_until_the_debt_drains() -> None:
    """10 per 100 ticks: reserved 10, used 15: 5 tokens of debt; one token more
    passes once 6 have refilled (60 ticks). Used 25: the debt stops at one
    bucket (-10 tokens), so 11 refills (110 ticks)."""
    algorithm, p = one("token_bucket")
    settle = settler(algorithm.step)
    _, full = algorithm.step(None, 0, 10, p)
    for actual, wait in ((15, 60), (25, 110), (10**9, 110)):
        state = settle.settle(full, 0, Change(actual - 10, 0, 10), p)
        decision = peek(algorithm.step, state, 0, 1, p)
        assert (decision.allowed, decision.remaining, decision.retry_after) == (False, 0, wait)
        assert not algorithm.step(state, wait - 1, 1, p)[0].allowed
        assert algorithm.step(state, wait, 1, p)[0].allowed


def test_an_over_run_goes_to_the_window_holding_now() -> None:
    """A fixed window's over-run settled after its window passed is charged to
    the current window."""
    algorithm, p = one("fixed_window")
    settle = settler(algorithm.step)
    _, state = algorithm.step(None, 10, 4, p)
    state = must(settle.settle(state, 120, Change(3, settle.mark(state, 10, p), 4), p))
    assert state == (200, 3)


def test_a_log_refund_removes_only_the_reservations_entries() -> None:
    algorithm, p = one("sliding_window_log")
    settle = settler(algorithm.step)
    _, state = algorithm.step(None, 10, 3, p)
    mark = settle.mark(state, 10, p)
    _, state = algorithm.step(state, 20, 2, p)
    state = must(settle.settle(state, 30, Change(-5, mark, 3), p))  # only 3 of its own to remove
    assert state == (120, 120, 120)


def test_a_calendar_window_settles_as_a_fixed_window() -> None:
    calendar = Calendar("Europe/Berlin", "day", "monday")
    step = calendar.step
    p = Params.build(10, 86_400 * 10**9)
    settle = settler(step)
    now = 1_700_000_000 * 10**9
    _, state = step(None, now, 8, p)
    mark = settle.mark(state, now, p)
    assert settle.settle(state, now + 1, Change(-5, mark, 8), p) == (state[0], 3)
    # the next day: a refund is void, an over-run counts in that day
    later = state[0] + 1
    assert settle.settle(state, later, Change(-5, mark, 8), p) == state
    assert must(settle.settle(state, later, Change(4, mark, 8), p))[1] == 4


@PARAM
def test_a_refund_to_a_state_that_is_gone_never_fills_past_whole(name: str) -> None:
    """The key was reset or evicted (or its Redis key expired) between the
    reservation and its cancel: the limit stays whole, and no more."""
    algorithm, p = one(name)
    settle = settler(algorithm.step)
    _, state = algorithm.step(None, 10, 8, p)
    mark = settle.mark(state, 10, p)
    gone = settle.settle(None, 10, Change(-8, mark, 8), p)
    valid(algorithm, p, gone, 10)
    assert peek(algorithm.step, gone, 10, 1, p).remaining == 10


class WindowModel:
    """A fixed window, naively: a count per window index; a reservation remembers
    its window's index."""

    def __init__(self, limit: int, period: int) -> None:
        self.limit, self.period, self.used = limit, period, dict[int, int]()

    def reserve(self, now: int, estimate: int) -> bool:
        w = now // self.period
        if self.used.get(w, 0) + estimate > self.limit:
            return False
        self.used[w] = self.used.get(w, 0) + estimate
        return True

    def settle(self, now: int, delta: int, at: int) -> None:
        w = now // self.period
        if delta > 0:
            self.used[w] = min(self.used.get(w, 0) + delta, self.limit)
        elif w == at // self.period:
            self.used[w] = max(self.used[w] + delta, 0)

    def remaining(self, now: int) -> int:
        return self.limit - self.used.get(now // self.period, 0)


class BucketModel:
    """A token bucket, naively, in exact fractions: tokens refill at limit/period
    up to burst; an over-run takes tokens down to -burst; a refund gives back at
    most the estimate less what refilled since it was reserved."""

    def __init__(self, limit: int, period: int, burst: int) -> None:
        self.rate, self.burst = Fraction(limit, period), burst
        self.tokens, self.at = Fraction(burst), 0

    def _refill(self, now: int) -> None:
        self.tokens = min(Fraction(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now

    def reserve(self, now: int, estimate: int) -> bool:
        self._refill(now)
        if self.tokens < estimate:
            return False
        self.tokens -= estimate
        return True

    def settle(self, now: int, delta: int, at: int, estimate: int) -> None:
        self._refill(now)
        if delta > 0:
            self.tokens = max(self.tokens - delta, Fraction(-self.burst))
        else:
            back = min(Fraction(-delta), max(estimate - (now - at) * self.rate, Fraction(0)))
            self.tokens = min(self.tokens + back, Fraction(self.burst))

    def remaining(self, now: int) -> int:
        self._refill(now)
        return max(math.floor(self.tokens), 0)


@pytest.mark.parametrize("name", ["fixed_window", "token_bucket", "gcra"])
@given(sc=settle_scenarios())
def test_settles_over_time_against_naive_models(name: str, sc: SettleScenario) -> None:
    """Windows passing and buckets refilling between reserves and settles: the
    step and settle functions admit and count as the naive models do."""
    algorithm, params = setup(name, sc)
    settle = settler(algorithm.step)
    model: Any = (
        WindowModel(sc.limit, sc.period)
        if name == "fixed_window"
        else BucketModel(sc.limit, sc.period, params.burst)
    )
    state: State | None = None
    now = sc.start
    held: list[Held] = []
    for gap, what, amount, pick in sc.ops:
        now += gap
        if what == "reserve" and amount:
            decision, state = algorithm.step(state, now, amount, params)
            assert decision.allowed == model.reserve(now, amount), f"reserve {amount} at {now}"
            if decision.allowed:
                held.append(Held(amount, settle.mark(state, now, params), now))
        elif what != "reserve" and held:
            r = held.pop(pick % len(held))
            delta = -r.estimate if what == "cancel" else amount - r.estimate
            state = settle.settle(state, now, Change(delta, r.mark, r.estimate), params)
            if name == "fixed_window":
                model.settle(now, delta, r.at)
            else:
                model.settle(now, delta, r.at, r.estimate)
        assert peek(algorithm.step, state, now, 1, params).remaining == model.remaining(now)

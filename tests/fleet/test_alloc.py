"""The allocation functions against simple references, and the invariant."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratewarden.fleet.alloc import ALLOCATORS, allocate, grant

wants_lists = st.lists(st.integers(0, 5_000_000), min_size=1, max_size=40)
totals = st.integers(0, 10_000_000)


def reference_fair(total: int, wants: list[int]) -> list[Fraction]:
    """Max-min fairness by progressive filling, in exact fractions: everybody's
    level rises together; whoever has what it wants drops out."""
    out = [Fraction(0)] * len(wants)
    active = [i for i, w in enumerate(wants) if w > 0]
    left = Fraction(total)
    while active and left > 0:
        step = min(left / len(active), *(wants[i] - out[i] for i in active))
        for i in active:
            out[i] += step
        left -= step * len(active)
        active = [i for i in active if out[i] < wants[i]]
    return out


def test_examples_from_the_issue() -> None:
    # max-min fair: capacity 100, wants 1/30/34/1000 -> 1/30/34/35 (Doorman: 34.5 to the third)
    assert allocate("fair_share", 100_000, [1_000, 30_000, 34_000, 1_000_000]) == [
        1_000,
        30_000,
        34_000,
        35_000,
    ]
    # Doorman's proportional share: capacity 120, wants 1000/50/10 -> ~69.7/40.3/10
    got = allocate("proportional_share", 120_000, [1_000_000, 50_000, 10_000])
    assert [round(g / 1000, 1) for g in got] == [69.7, 40.3, 10.0]
    assert allocate("equal", 10_000, [0] * 96)[:3] == [105, 105, 105]
    assert sum(allocate("equal", 10_000, [0] * 96)) == 10_000
    assert allocate("static", 100_000, [5_000, 50_000], cap=20_000) == [5_000, 20_000]


@given(totals, wants_lists)
def test_grants_in_range_and_sum_at_most_total(total: int, wants: list[int]) -> None:
    for algorithm in ("proportional_share", "fair_share"):
        got = allocate(algorithm, total, wants)
        assert all(0 <= g <= w for g, w in zip(got, wants, strict=True)), algorithm
        assert sum(got) <= total, algorithm
        if sum(wants) <= total:  # no overload: everybody gets what it wants
            assert got == wants
    equal = allocate("equal", total, wants)
    assert sum(equal) == total
    assert max(equal) - min(equal) <= 1


@given(totals, wants_lists)
def test_fair_share_is_max_min_fair(total: int, wants: list[int]) -> None:
    got = allocate("fair_share", total, wants)
    exact = reference_fair(total, wants)
    for g, e in zip(got, exact, strict=True):
        assert e - 1 <= g <= e  # the level floored to a millipermit
    if sum(wants) > total:
        level = max(got)
        # nobody below the level wants more (else it would have been raised)
        assert all(g in (w, level) for g, w in zip(got, wants, strict=True))
        assert total - sum(got) < len(wants)  # only the flooring is left on the table


@given(totals, wants_lists)
def test_proportional_share_follows_doormans_formula(total: int, wants: list[int]) -> None:
    got = allocate("proportional_share", total, wants)
    if sum(wants) <= total:
        return
    n = len(wants)
    equal = Fraction(total, n)
    left = sum((equal - w for w in wants if w <= equal), Fraction(0))
    excess = sum((w - equal for w in wants if w > equal), Fraction(0))
    for g, w in zip(got, wants, strict=True):
        expected = Fraction(w) if w <= equal else equal + left * (w - equal) / excess
        assert abs(g - expected) <= 1 + expected * Fraction(1, 10**9)


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.integers(0, 10**7))
def test_grant_never_exceeds_what_others_leave_never_negative(
    target: int, total: int, others: int
) -> None:
    g = grant(target, total, others)
    assert 0 <= g <= target
    assert g <= max(0, total - others)
    if others <= total:
        assert g + others <= total


def test_unknown_algorithm() -> None:
    with pytest.raises(ValueError, match="unknown"):
        allocate("nope", 10, [1])
    assert set(ALLOCATORS) == {"equal", "proportional_share", "fair_share", "static"}
    assert allocate("fair_share", 10, []) == []
    assert math.isfinite(float(sum(allocate("proportional_share", 1, [0, 5]))))

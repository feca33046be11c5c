"""The coordinator's safety invariant, on its Python model (which the parity suite
holds to the Lua script): whatever members report, whenever they refresh, however
the total moves, what the coordinator counts as held never exceeds the total, and
the live members' pieces of the line lie inside it and never overlap."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from ratewarden.fleet import QuotaConfig
from ratewarden.fleet.alloc import ALLOCATORS
from ratewarden.fleet.coordinator import Report
from ratewarden.fleet.model import Model, _unpack

START_MS = 1_763_900_000_000

steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("refresh"),
            st.integers(0, 9),  # member
            st.integers(0, 5_000_000),  # wants
            st.integers(0, 5_000_000),  # what it claims to hold
            st.integers(0, 1),  # throttled by the provider
        ),
        st.tuples(st.just("total"), st.integers(1, 5_000)),
        st.tuples(st.just("algorithm"), st.sampled_from(ALLOCATORS)),
        st.tuples(st.just("wait"), st.integers(0, 7_000)),
        st.tuples(st.just("leave"), st.integers(0, 9)),
    ),
    max_size=80,
)


def held(model: Model, now: int) -> int:
    """What the live members hold; checks that their pieces tile without overlap."""
    total = int(model.cfg["eff_m"])
    records = [_unpack(r) for r in model.members.values()]
    live = [(head, pieces) for head, pieces in records if head[1] > now]
    spans = sorted(piece for _, pieces in live for piece in pieces)
    for (start, length), (after, _) in itertools.pairwise(spans):
        assert start + length <= after, spans
    for start, length in spans:
        assert length > 0, spans
        assert start >= 0, spans
        assert start + length <= total, spans
    for head, pieces in live:
        assert sum(length for _, length in pieces) == head[3]
    return sum(head[3] for head, _ in live)


@given(st.sampled_from(ALLOCATORS), st.booleans(), steps)
def test_sum_of_grants_never_exceeds_the_total(
    algorithm: str, adaptive: bool, sequence: list[tuple[object, ...]]
) -> None:
    now = START_MS
    config = QuotaConfig("1000/second", algorithm, cap=300, adaptive=adaptive)
    model = Model()
    model.set(now, config.fields())
    for step in sequence:
        kind = step[0]
        if kind == "refresh":
            _, member, wants, claims, throttled = step
            report = Report(
                int(wants),  # type: ignore[call-overload]
                int(claims),  # type: ignore[call-overload]
                0,
                int(throttled),  # type: ignore[call-overload]
            )
            reply = model.refresh(now, f"m{member}", report)
            assert reply[1] >= 0  # never a negative grant
        elif kind == "total":
            config = config.but(rate=f"{step[1]}/second")
            model.set(now, config.fields())
        elif kind == "algorithm":
            config = config.but(algorithm=step[1])
            model.set(now, config.fields())
        elif kind == "wait":
            now += int(step[1])  # type: ignore[call-overload]
        else:
            model.leave(now, f"m{step[1]}")
        assert held(model, now) <= int(model.cfg["eff_m"]) <= config.rate.limit * 1000


def test_a_new_member_converges_within_two_refreshes() -> None:
    model = Model()
    now = START_MS
    model.set(now, QuotaConfig("100/second", "fair_share").fields())
    for m in ("a", "b", "c"):
        model.refresh(now, m, Report(wants=100_000, has=0, used=0))
    for m in ("a", "b", "c"):  # settled: a third each
        model.refresh(now, m, Report(wants=100_000, has=0, used=0))
    grants = {}
    for _ in range(2):  # d joins; everybody refreshes twice
        for m in ("d", "a", "b", "c"):
            now += 250
            grants[m] = model.refresh(now, m, Report(wants=100_000, has=0, used=0))[1]
    assert grants == {"a": 25_000, "b": 25_000, "c": 25_000, "d": 25_000}


def test_adaptive_total_cuts_multiplicatively_and_recovers_additively() -> None:
    model = Model()
    now = START_MS
    model.set(now, QuotaConfig("1000/second", "equal", adaptive=True, floor=100).fields())
    model.refresh(now, "a", Report(wants=0, has=0, used=0, throttled=1))
    assert model.cfg["eff_m"] == "750000"
    model.refresh(now + 500, "a", Report(wants=0, has=0, used=0, throttled=1))
    assert model.cfg["eff_m"] == "750000"  # one cut per two refresh intervals
    now += 2_000
    effective = []
    for _ in range(20):
        model.refresh(now, "a", Report(wants=0, has=0, used=0))
        effective.append(int(model.cfg["eff_m"]))
        now += 1_000
    assert effective[:3] == [770_000, 790_000, 810_000]  # +2% of the ceiling a refresh
    assert effective[-1] == 1_000_000  # back to the ceiling, never above

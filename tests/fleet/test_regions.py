"""Region splits without I/O: the configuration, the regional limit's cases, the
demand estimate, and the safety of the whole protocol against the coordinator's
model: in no window do the regional limits in force add up past the global."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratewarden import ConfigurationError
from ratewarden.fleet import RegionSplit, Report
from ratewarden.fleet._regions import Demand, Record, limit_at, next_limits
from ratewarden.fleet.coordinator import parse_refresh
from ratewarden.fleet.model import Model

W = 1000  # ms: the window of "…/second"
T0 = 1_763_900_000_000  # ms, a window edge


def split(**options: object) -> RegionSplit:
    return RegionSplit("api", "1000/second", {"us": 1, "eu": 1, "ap": 1}, **options)  # type: ignore[arg-type]


def test_static_shares_are_floors_of_the_weights() -> None:
    s = RegionSplit("api", "100/second", {"us": 2, "eu": 1, "ap": 0.5})
    assert dict(s.static) == {"us": 57, "eu": 28, "ap": 14}
    assert sum(s.static.values()) <= 100
    assert split().static == {"us": 333, "eu": 333, "ap": 333}


@pytest.mark.parametrize(
    ("regions", "options", "message"),
    [
        ({}, {}, "names no regions"),
        ({"us": -1}, {}, "weight -1"),
        ({"us": True}, {}, "weight True"),
        ({"us": 0}, {}, "sum to 0"),
        ({"u s": 1}, {}, "quota name"),
        ({"us": 1}, {"allocation": "static"}, "allocation"),
        ({"us": 1}, {"algorithm": "token_bucket"}, "carry over"),
        ({"us": 1}, {"poll": 0}, "poll"),
        ({"us": 1}, {"refresh": 3.0}, "lease"),
    ],
)
def test_bad_configuration_is_named(
    regions: dict[str, float], options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RegionSplit("api", "10/second", regions, **options)  # type: ignore[arg-type]


def test_unknown_region() -> None:
    with pytest.raises(ConfigurationError, match="no region 'mars'"):
        split().check_region("mars")


def test_limit_at_each_case() -> None:
    record = Record(limit=100, next=500, next_ms=T0 + W, until_ms=T0 + 5500, lease_ms=5000)
    assert limit_at(None, T0, 333, W) == (333, None)
    assert limit_at(record, T0 + 10, 333, W) == (100, T0 + W)  # the raise not due yet
    assert limit_at(record, T0 + W, 333, W) == (500, T0 + 5500)  # at its window edge
    assert limit_at(record, T0 + 5500, 333, W) == (333, T0 + 11_000)  # lapsed: min(static, last)
    assert limit_at(record, T0 + 10_999, 400, W) == (400, T0 + 11_000)
    low = Record(limit=100, next=0, next_ms=0, until_ms=T0 + 5500, lease_ms=5000)
    assert limit_at(low, T0 + 6000, 333, W) == (100, T0 + 11_000)  # no more than the grant
    assert limit_at(low, T0 + 11_000, 333, W) == (333, None)  # static from a window edge
    late = Record(limit=100, next=500, next_ms=T0 + 6000, until_ms=T0 + 5500, lease_ms=5000)
    assert limit_at(late, T0 + 5600, 333, W) == (100, T0 + 11_000)  # a raise after the lease


def test_next_limits_lowers_at_once_and_raises_at_an_edge() -> None:
    s = split()  # poll 0.1 s, margin 0.05 s
    now = T0 + 900
    full = {"members": 3, "now_ms": now, "sent_ms": now - 5}
    low = next_limits(s, "us", before=None, grant_m=200_400, **full)
    assert low == Record(200, 0, 0, now - 5 + 5000, 5000)  # below static 333: at once
    high = next_limits(s, "us", before=low, grant_m=700_000, **full)
    assert (high.limit, high.next, high.next_ms) == (200, 700, T0 + 2 * W)  # 900+150 > 1000
    early = next_limits(s, "us", before=low, grant_m=700_000, **{**full, "now_ms": T0 + 100})
    assert early.next_ms == T0 + W
    lower = next_limits(s, "us", before=high, grant_m=150_000, **full)
    assert (lower.limit, lower.next) == (150, 0)  # drops the pending raise
    # a raise pending keeps its time; a larger grant meanwhile waits for the next refresh
    later = next_limits(s, "us", before=high, grant_m=900_000, **{**full, "now_ms": T0 + 1950})
    assert (later.limit, later.next, later.next_ms) == (200, 700, T0 + 2 * W)
    # until every region is a member, no more than the static share
    alone = next_limits(s, "us", before=None, grant_m=1_000_000, **{**full, "members": 1})
    assert (alone.limit, alone.next) == (333, 0)


def test_demand_joins_periods_and_ignores_small_moves() -> None:
    demand = Demand(W)
    assert demand.wants is None
    assert demand.add(500, 1000) == 500_000
    assert demand.add(505, 1000) == 500_000  # 1%: no change
    assert demand.add(600, 1000) == 600_000
    assert demand.add(3, 1000) == 301_500  # too few calls: the period before joins in
    assert demand.add(0, 0) == demand.wants


# -- the protocol against the model coordinator ---------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    return {
        "total": draw(st.sampled_from([10, 100, 1000])),
        "weights": draw(st.lists(st.integers(1, 5), min_size=3, max_size=3)),
        "demands": draw(
            st.lists(st.lists(st.integers(0, 2000), min_size=3, max_size=3), min_size=1, max_size=6)
        ),
        "phases": draw(st.lists(st.integers(0, 999), min_size=6, max_size=6)),
        "dies": draw(st.one_of(st.none(), st.tuples(st.integers(0, 2), st.integers(0, 20_000)))),
        "home_down": draw(st.one_of(st.none(), st.integers(0, 20_000))),
    }


@given(scenarios())
def test_regional_limits_never_sum_past_the_global_in_any_window(
    scenario: dict[str, object],
) -> None:
    """Three regions on the model coordinator, demands changing every 5 s, each
    rebalancer refreshing each second at its own phase, each region's limiters
    polling every 100 ms at theirs; one rebalancer may die, the home may go
    away. Each window, the largest limit each region had in force in it, summed,
    stays within the total."""
    total = scenario["total"]
    assert isinstance(total, int)
    names = ["us", "eu", "ap"]
    weights = dict(zip(names, scenario["weights"], strict=True))  # type: ignore[call-overload]
    s = RegionSplit("api", f"{total}/second", weights, lease=2.0)
    model = Model()
    model.set(T0, s.quota_config().fields())
    demands: list[list[int]] = scenario["demands"]  # type: ignore[assignment]
    phases: list[int] = scenario["phases"]  # type: ignore[assignment]
    dies: tuple[int, int] | None = scenario["dies"]  # type: ignore[assignment]
    home_down: int | None = scenario["home_down"]  # type: ignore[assignment]
    written: dict[str, Record | None] = dict.fromkeys(names)  # in each regional Redis
    seen: dict[str, Record | None] = dict.fromkeys(names)  # by the region's limiters
    held = dict.fromkeys(names, 0)
    end = T0 + 5000 * len(demands) + 8000
    peak = dict.fromkeys(names, 0)
    for now in range(T0, end, 10):
        step = min((now - T0) // 5000, len(demands) - 1)
        for i, region in enumerate(names):
            dead = dies is not None and dies[0] == i and now >= T0 + dies[1]
            down = home_down is not None and now >= T0 + home_down
            if (now - T0 - phases[i]) % 1000 == 0 and not dead and not down:
                report = Report(demands[step][i] * 1000, held[region], 0)
                raw = model.refresh(now, region, report)
                reply = parse_refresh(raw)
                assert reply is not None
                held[region] = reply.grant
                written[region] = next_limits(
                    s,
                    region,
                    before=written[region],
                    grant_m=reply.grant,
                    members=reply.members,
                    now_ms=now,
                    sent_ms=now,
                )
            if (now - T0 - phases[3 + i] % 10 * 10) % 100 == 0:  # every poll, at its phase
                seen[region] = written[region]
            limit, _ = limit_at(seen[region], now, s.static[region], W)
            peak[region] = max(peak[region], limit)
        if (now + 10) % W == 0:  # the window ends
            assert sum(peak.values()) <= total, (now, peak)
            peak = dict.fromkeys(names, 0)

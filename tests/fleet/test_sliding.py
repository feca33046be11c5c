"""The sliding mode: for a provider that counts any rolling window, no stretch
of one window, wherever it starts, sees more than the total from the fleet."""

from __future__ import annotations

from ratewarden.fleet import QuotaConfig
from ratewarden.fleet._share import Share
from ratewarden.sim._command import simulate
from ratewarden.sim._scenarios import Scenario

W = 1_000_000_000


def test_the_mode_is_stored_with_the_resource() -> None:
    config = QuotaConfig("10/second", sliding=True)
    assert QuotaConfig.from_fields(config.fields()).sliding
    assert not QuotaConfig.from_fields(QuotaConfig("10/second").fields()).sliding
    assert "sliding" in config.describe()


def test_permits_are_spaced_by_the_window_over_the_grants_whole_permits() -> None:
    share = Share(W, strict=True)
    share.apply(2_500, 2_500, ((0, 2_500),), 0, settled=True)  # 2.5 permits: 2 whole
    assert share.take(0) == 0
    assert share.take(1) == W // 2 - 1  # half a window after the first
    assert share.take(W // 2 + 300_000_000) == 0  # late by 0.3 window: not made up
    assert share.take(W // 2 + 600_000_000) == 500_000_000 - 300_000_000


def test_a_smaller_grant_spaces_the_next_permit_further_at_once() -> None:
    share = Share(W, strict=True)
    share.apply(10_000, 10_000, ((0, 10_000),), 0, settled=True)
    assert share.take(0) == 0
    share.apply(2_000, 10_000, ((0, 2_000),), 1)
    assert share.take(W // 10) == W // 2 - W // 10  # spaced by the new grant


def test_a_larger_grant_waits_until_the_time_it_is_given() -> None:
    share = Share(W, strict=True)
    share.apply(1_000, 1_000, ((0, 1_000),), 0, settled=True)
    share.apply(3_000, 3_000, ((0, 3_000),), 100, not_before=2 * W + 1)
    assert share.pending == 3_000
    share.window_state(2 * W)
    assert share.pending == 3_000  # not in the window that holds not_before
    share.window_state(3 * W)
    assert share.grant == 3_000


def test_no_rolling_window_holds_more_than_the_total() -> None:
    plain = Scenario(members=8, seconds=20, skew_ms=100.0, warmup=2)
    assert simulate(plain).rolling_max > 2000  # what the mode is for
    r = simulate(plain.but(sliding=True))
    assert r.rolling_max <= 2000
    assert r.utilisation >= 0.99


def test_blocking_pools_stay_within_any_rolling_window() -> None:
    scenario = Scenario(members=4, rate="500/second", workers=8, seconds=20, skew_ms=100.0)
    r = simulate(scenario.but(sliding=True))
    assert r.rolling_max <= 500
    assert r.utilisation >= 0.99


def test_a_promised_grant_is_not_put_off_by_later_changes() -> None:
    share = Share(W, strict=True)
    share.apply(1_000, 1_000, ((0, 1_000),), 0, settled=True)
    share.apply(3_000, 3_000, ((0, 3_000),), 100, not_before=2 * W + 1)
    share.apply(2_500, 3_000, ((0, 2_500),), 200, not_before=5 * W)  # space freed since
    share.window_state(3 * W)
    assert share.grant == 2_500  # at the time the first grant was given, within its space

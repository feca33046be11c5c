"""One member's share: whole permits per window, rotation, pacing, grant changes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ratewarden.fleet._share import Share
from ratewarden.fleet.alloc import allocate

S = 1_000_000_000
W0 = 1_763_900_000  # a window index of today's magnitude (1 s windows)


def piece(start: int, grant: int) -> tuple[tuple[int, int], ...]:
    return ((start, grant),) if grant else ()


def given_grant(share: Share, grant: int, now: int, *, held: int | None = None) -> None:
    """A first grant, on a resource with room to spare (it applies at once)."""
    share.apply(grant, grant if held is None else held, piece(0, grant), now, settled=True)


def shares_for(grants: list[int], *, pace: bool = False) -> list[Share]:
    """Members laid out end to end, as a coordinator may place them."""
    held = sum(grants)
    out, start = [], 0
    for g in grants:
        share = Share(S, pace=pace)
        share.apply(g, held, piece(start, g), W0 * S, settled=True)
        out.append(share)
        start += g
    return out


@given(st.integers(1, 2_000), st.integers(1, 120), st.integers(0, 10**6))
def test_equal_split_sums_to_the_total_every_window(total: int, members: int, w: int) -> None:
    grants = allocate("equal", total * 1000, [0] * members)
    shares = shares_for(grants)
    counts = [s.permits(W0 + w) for s in shares]
    assert sum(counts) == total
    assert max(counts) - min(counts) <= 1


@given(
    st.integers(1, 500),
    st.lists(st.integers(0, 400_000), min_size=1, max_size=50),
    st.integers(0, 10**6),
)
def test_any_grants_never_exceed_the_total_in_a_window(
    total: int, wants: list[int], w: int
) -> None:
    grants = allocate("fair_share", total * 1000, wants)
    shares = shares_for(grants)
    assert sum(s.permits(W0 + w) for s in shares) <= total


def test_ten_a_second_over_96_rotates_and_never_exceeds_ten() -> None:
    shares = shares_for(allocate("equal", 10_000, [0] * 96))
    got = [0] * 96
    for w in range(960):
        counts = [s.permits(W0 + w) for s in shares]
        assert sum(counts) == 10
        got = [a + b for a, b in zip(got, counts, strict=True)]
    assert min(got) >= 97  # every member gets its turn: ~100 each over 960 windows
    assert max(got) <= 103


def test_take_spends_a_window_then_waits_for_the_next() -> None:
    share = Share(S)
    now = W0 * S + 100
    given_grant(share, 3000, now)
    assert [share.take(now) for _ in range(3)] == [0, 0, 0]
    wait = share.take(now)
    assert wait == S - 100  # until the next window edge
    assert share.take(now + wait) == 0
    assert share.take(now, 4) > 0  # a cost beyond the window's permits waits


def test_pacing_spreads_the_window() -> None:
    share = Share(S, pace=True)
    start = W0 * S
    given_grant(share, 4000, start)
    times: list[int] = []
    now = start
    while len(times) < 8:
        wait = share.take(now)
        if wait == 0:
            times.append(now - start)
        else:
            now += wait
    assert times == [0, S // 4, S // 2, 3 * S // 4, S, S + S // 4, S + S // 2, S + 3 * S // 4]


def test_a_smaller_grant_applies_at_once_a_larger_from_the_next_window() -> None:
    share = Share(S)
    now = W0 * S
    given_grant(share, 10_000, now)
    for _ in range(4):
        assert share.take(now) == 0
    share.apply(5_000, 5_000, piece(0, 5_000), now + 1)  # less: 4 spent, 1 left
    assert share.take(now + 2) == 0
    assert share.take(now + 3) > 0
    share.apply(20_000, 20_000, piece(0, 20_000), now + 4)  # more: from the next window
    assert share.pending == 20_000
    assert share.take(now + 5) > 0
    assert share.window_state(now + S) == (20, 0)
    assert share.pending is None


def test_a_cut_scales_the_grant_at_once() -> None:
    share = Share(S)
    now = W0 * S
    share.apply(10_000, 40_000, piece(30_000, 10_000), now, settled=True)
    share.scale(20_000, 40_000)
    assert (share.grant, share.held, share.pieces) == (5_000, 20_000, ((15_000, 5_000),))
    assert share.window_state(now) == (5, 0)


def test_report_measures_asked_and_used_per_window() -> None:
    share = Share(S, now=0)
    given_grant(share, 10_000, 0)
    share.asked = 30
    for _ in range(10):
        share.take(S // 2)
    assert share.report(2 * S) == (15_000, 10_000, 5_000)  # over two windows


def test_blocked_callers_ask_for_more_than_they_hold() -> None:
    """Callers that block on acquire ask only as fast as they are served: when one
    was waiting nine tenths of the time and the grant was all spent, the member
    asks for an eighth more (once past its first reports, while demand settles)."""
    share = Share(S, now=0)
    given_grant(share, 10_000, 0)
    assert share.cooldown == 8
    share.cooldown = 0  # settled
    for _ in range(10):
        share.asked += 1
        share.take(0)
    share.begin_wait(S // 20)  # a caller waits from 0.05 s to the end
    assert share.report(S)[0] == 10_000 + 1_250 + 1_000
    share.end_wait(S + S // 2)  # ...and on to 1.5 s: half of the next period
    for _ in range(10):
        share.asked += 1
        share.take(S)
    assert share.report(2 * S)[0] == 10_000  # waiting half the time is no sign


def test_a_period_too_short_to_measure_repeats_the_last_figures() -> None:
    share = Share(S, now=0)
    given_grant(share, 10_000, 0)
    share.asked = 8
    assert share.report(S, S // 2)[0] == 8_000
    share.asked = 1  # one call a millisecond after: not a rate of 1000 a second
    assert share.report(S + 1_000_000, S // 2)[0] == 8_000
    share.asked += 3
    # the period went on (4 calls), and too few calls bring the period before in: 12 in 2 s
    assert share.report(2 * S, S // 2)[0] == 6_000


def test_a_late_wake_up_keeps_the_pacing_schedule() -> None:
    share = Share(S, pace=True)
    start = W0 * S
    given_grant(share, 4000, start)
    i = S // 4
    assert share.take(start) == 0
    assert share.take(start + i + i // 2) == 0  # half an interval late
    assert share.take(start + 2 * i) == 0  # the next slot has not moved
    assert share.take(start + 2 * i + 1) > 0  # and no burst beyond it


def test_after_an_idle_spell_the_schedule_starts_again() -> None:
    share = Share(S, pace=True)
    start = W0 * S
    given_grant(share, 4000, start)
    assert share.take(start + S // 2) == 0
    assert share.take(start + S // 2) == S // 4  # no catching up on the idle slots


def test_an_unused_boost_is_not_asked_for_again_for_a_while() -> None:
    share = Share(S, now=0)
    given_grant(share, 20_000, 0)
    share.cooldown = 0  # settled

    def period(start: int, asked: int) -> int:
        share.begin_wait(start)
        for _ in range(asked):
            share.asked += 1
            share.take(start)
        share.end_wait(start + S)
        return share.report(start + S)[0]

    assert period(0, 20) == 20_000 + 2_500 + 1_000  # looked like a blocked pool
    share.apply(23_500, 23_500, piece(0, 23_500), S)  # applies from the next window
    assert period(S, 20) == 20_000  # the boost went unused: open-loop callers after all
    assert [period(k * S, 23) for k in range(2, 10)] == [23_000] * 8  # no boost meanwhile
    assert period(10 * S, 23) == 23_500 + 2_937 + 1_000  # then it tries again
    assert period(11 * S, 23) == 23_000  # unused again: twice as long before the next try
    assert [period(k * S, 23) for k in range(12, 28)] == [23_000] * 16
    assert period(28 * S, 23) > 23_500


def test_a_call_more_or_less_is_the_same_demand() -> None:
    """Counting evenly spaced calls over a second gives 147 or 148: the member
    reports the same demand, so the fleet's shares do not move for nothing."""
    share = Share(S, now=0)
    given_grant(share, 200_000, 0)
    wants = []
    for k, asked in enumerate([147, 148, 147, 147, 148, 150, 160]):
        share.asked = asked
        wants.append(share.report((k + 1) * S)[0])
    assert wants == [147_000] * 5 + [150_000, 160_000]


def test_new_space_waits_for_the_window_edge_unless_settled() -> None:
    """Space another member gave up in this window may be spent already: a grant
    that takes new space (grows, or moves) applies from the next window edge,
    unless the coordinator says nobody gave any up for two windows."""
    now = W0 * S
    moved = Share(S)
    given_grant(moved, 3000, now)
    moved.apply(3000, 3000, piece(5000, 3000), now + 1)  # the same grant elsewhere
    assert moved.pieces == piece(0, 3000)
    assert moved.position == piece(5000, 3000)  # what it reports as held
    assert moved.window_state(now + S) == (3, 0)
    assert moved.pieces == piece(5000, 3000)
    fresh = Share(S)
    fresh.apply(3000, 3000, piece(0, 3000), now)
    assert fresh.take(now) > 0
    assert fresh.take(now + S) == 0
    settled = Share(S)
    settled.apply(3000, 3000, piece(0, 3000), now, settled=True)
    assert settled.take(now) == 0


def test_pieces_count_the_marks_inside_them() -> None:
    share = Share(S)
    share.apply(3000, 3000, ((0, 1000), (5000, 1000), (9000, 1000)), W0 * S, settled=True)
    assert all(share.permits(W0 + w) == 3 for w in range(50))
    share.apply(1500, 1500, ((0, 1000), (5000, 500)), W0 * S)  # less: at once
    assert {share.permits(W0 + w) for w in range(50)} == {1, 2}


def test_waiting_callers_reserve_the_next_slots_in_turn() -> None:
    """Paced, a waiting caller holds its slot and only sleeps until it is due:
    a late wake-up spends it late instead of losing it, and waiters do not race."""
    share = Share(S, pace=True)
    start = W0 * S
    given_grant(share, 4000, start)
    i = S // 4
    assert share.take(start) == 0
    assert share.reserve(start, 1, S) == (True, i)  # the next slot is the caller's
    assert share.reserve(start, 1, S) == (True, 2 * i)  # and the one after, the next's
    assert share.reserve(start, 1, 2 * i) == (False, 3 * i)  # past its patience
    assert share.reserve(start, 1, S) == (True, 3 * i)
    assert share.reserve(start, 1, S) == (False, S)  # the window is spent: its edge
    assert share.window_state(start + 3 * i + i // 2) == (4, 4)  # all four spent

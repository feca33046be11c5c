"""The invariant through a loss of the coordinator: members (real `Member`s)
against the coordinator's model, refreshing at their own moments; the
coordinator goes away for longer than a lease and comes back. At every step,
what the members may spend now, summed, stays within the total: while their
leases end one after another and they fall back to the safe share, and while
they come back to a coordinator that has dropped their records."""

from __future__ import annotations

import os
import signal
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from ratewarden._errors import StoreUnavailable
from ratewarden.fleet import FleetQuota, QuotaConfig
from ratewarden.fleet.alloc import MILLI
from ratewarden.fleet.member import Member
from ratewarden.sim._backend import ModelBackend, TrueClock
from tests.redis_server import redis_server

START = 1_763_900_000 * 10**9
NAME = "fallback"
WINDOW = 10**9

steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("demand"),
            st.integers(0, 5),  # member
            st.integers(0, 1_500),  # calls a second from now on
        ),
        st.tuples(st.just("wait"), st.integers(1, 2_500)),  # ms
        st.tuples(st.just("redis"), st.booleans()),  # it answers, or not
    ),
    max_size=120,
)


class Fleet:
    """Members that try a refresh every ``intervals[i]`` ms, as FleetQuota's loop does."""

    def __init__(self, count: int, config: QuotaConfig, intervals: list[int]) -> None:
        self.clock = TrueClock(START)
        self.backend = ModelBackend(self.clock)
        self.backend.set(config)
        self.total = config.rate.limit * MILLI
        self.up = True
        self.members = [
            Member(NAME, self.clock, member_id=f"m{i}", pace=True, config=config)
            for i in range(count)
        ]
        for member in self.members:  # as FleetQuota.start: a refresh, then another
            self.refresh(member)
            self.refresh(member)
        self.intervals = [ms * 1_000_000 for ms in intervals]
        self.due = [START + interval for interval in self.intervals]
        self.rates = [0] * count  # each member's callers, calls a second

    def wait(self, ns: int) -> None:
        """Time passes; each member refreshes when it is due. Checked at every
        refresh and every window edge (where larger grants apply)."""
        end = self.clock.now + ns
        while True:
            i = min(range(len(self.members)), key=lambda k: self.due[k])
            edge = (self.clock.now // WINDOW + 1) * WINDOW
            if min(self.due[i], edge) > end:
                break
            if edge < self.due[i]:
                self.clock.now = edge
            else:
                self.clock.now = self.due[i]
                self.members[i].share.demand.asked += self.rates[i] * self.intervals[i] // 10**9
                self.refresh(self.members[i])
                self.due[i] += self.intervals[i]
            assert self.spending() <= self.total, self.state()
        self.clock.now = end

    def state(self) -> list[tuple[str, int, bool]]:
        return [(m.id, m.share.grant, m.fallen_back) for m in self.members]

    def refresh(self, member: Member) -> None:
        report = member.report()
        sent_at = self.clock.time_ns()
        if not self.up:
            member.on_failure(StoreUnavailable("redis: gone"))
            return
        reply = self.backend.refresh(member.id, report)
        assert reply is not None
        member.on_reply(reply, sent_at)

    def spending(self) -> int:
        """What the members may spend now (a larger grant from its window edge on)."""
        now = self.clock.time_ns()
        total = 0
        for member in self.members:
            member.share.window_state(now)
            total += member.share.grant
        return total


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(900, 1100), min_size=2, max_size=6),  # each member's interval, ms
    st.sampled_from(["equal", 0, 100]),
    steps,
)
def test_what_members_may_spend_stays_within_the_total(
    intervals: list[int], safe: str | int, sequence: list[tuple[object, ...]]
) -> None:
    config = QuotaConfig("1000/second", "fair_share", refresh=1.0, lease=3.0, safe=safe)
    fleet = Fleet(len(intervals), config, intervals)
    assert fleet.spending() <= fleet.total
    for step in sequence:
        if step[0] == "demand":
            _, index, rate = step
            fleet.rates[int(index) % len(intervals)] = int(rate)  # type: ignore[call-overload]
        elif step[0] == "wait":
            fleet.wait(int(step[1]) * 1_000_000)  # type: ignore[call-overload]
        else:
            fleet.up = bool(step[1])
        assert fleet.spending() <= fleet.total, fleet.state()


def test_safe_shares_of_members_that_saw_different_memberships_add_up_to_the_total() -> None:
    """The first member saw itself alone; when Redis goes away before it hears of
    the second, its safe share is still the whole total, so the second's is 0."""
    config = QuotaConfig("1000/second", "fair_share", refresh=1.0, lease=3.0, safe="equal")
    fleet = Fleet(2, config, [1000, 1000])
    first, second = fleet.members
    assert (first.safe, second.safe) == (1_000_000, 0)
    fleet.up = False
    fleet.wait(8_000_000_000)  # both fall back, in two steps
    assert first.fallen_back
    assert second.fallen_back
    assert fleet.spending() <= fleet.total
    fleet.up = True
    fleet.wait(4_000_000_000)  # a rebuild (two refreshes), then a refresh each
    assert (first.safe, second.safe) == (500_000, 500_000)


def test_a_record_that_ends_while_its_member_spends_holds_the_others_back() -> None:
    """A member's lease ends between two of its refreshes: until it reports (a
    rebuild), the coordinator does not hand its share to another."""
    config = QuotaConfig("1000/second", "fair_share", refresh=1.0, lease=3.0, safe="equal")
    fleet = Fleet(2, config, [1000, 1000])
    big, small = fleet.members
    for _ in range(3):
        big.share.demand.asked += 900
        small.share.demand.asked += 2_000
        fleet.clock.now += 1_000_000_000
        fleet.refresh(big)
        fleet.refresh(small)
    fleet.clock.now += 2_500_000_000
    fleet.up = False
    fleet.refresh(big)  # cut off alone; its lease has not ended yet
    fleet.up = True
    small.share.demand.asked += 5_000
    fleet.refresh(small)
    fleet.clock.now += 600_000_000  # big's record has ended, big still spends
    small.share.demand.asked += 5_000
    fleet.refresh(small)
    fleet.clock.now += 1_000_000_000  # past the window edge
    assert fleet.spending() <= fleet.total, fleet.state()


def test_leases_that_end_one_after_another_shrink_before_anyone_grows() -> None:
    """A member below the equal share whose lease ends first does not grow to it
    while one above it still spends its grant."""
    config = QuotaConfig("1000/second", "fair_share", refresh=1.0, lease=3.0, safe="equal")
    fleet = Fleet(2, config, [1000, 1000])
    big, small = fleet.members
    for _ in range(3):
        big.share.demand.asked += 900
        small.share.demand.asked += 100
        fleet.clock.now += 1_000_000_000
        fleet.refresh(small)
        fleet.refresh(big)
    assert (big.grant, small.grant) == (900.0, 100.0)
    fleet.up = False
    fleet.clock.now += 3_050_000_000  # small's lease (sent first) has ended; big's not
    fleet.refresh(small)
    assert small.fallen_back
    assert small.grant == 100.0  # the smaller: no more than it held
    assert fleet.spending() <= fleet.total
    fleet.clock.now += 100_000_000
    fleet.refresh(big)
    assert big.grant == 500.0  # shrunk at once
    fleet.clock.now += 3_000_000_000  # a lease later: the whole safe share
    fleet.refresh(small)
    fleet.refresh(big)
    fleet.clock.now += 1_000_000_000  # from the next window edge
    assert fleet.spending() == fleet.total
    assert (big.share.grant, small.share.grant) == (500_000, 500_000)


def _spend(quotas: list[FleetQuota], admitted: dict[int, int], stop: threading.Event) -> None:
    """Each member's callers take every permit they can, counted per second of real time."""

    def work(quota: FleetQuota) -> None:
        while not stop.is_set():
            if quota.try_acquire():
                second = time.time_ns() // 10**9
                admitted[second] = admitted.get(second, 0) + 1
            else:
                time.sleep(0.001)

    for quota in quotas:
        threading.Thread(target=work, args=(quota,), daemon=True).start()


def _watch(quotas: list[FleetQuota], seconds: float) -> int:
    """The most the members could spend at once, sampled every 5 ms."""
    worst = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        total = 0
        for quota in quotas:
            with quota._lock:
                quota._member.share.window_state(quota.clock.time_ns())
                total += quota._member.share.grant
        worst = max(worst, total)
        time.sleep(0.005)
    return worst


def test_a_real_fleet_through_an_outage_longer_than_a_lease() -> None:
    """Three members of 200/s (stated demands 150, 30 and 20) on a redis-server
    of the test's own, which stops answering for a lease and 3 s (SIGSTOP) and
    then comes back with every record ended. Sampled every 5 ms, what the
    members may spend never adds up to more than the total; what they admit in
    any second of real time stays within it, but for a permit a member (pacing).
    Their grants are what they were within 1.5 s (six refreshes) of Redis answering."""
    config = QuotaConfig("200/second", "fair_share", refresh=0.25, lease=1.0, safe="equal")
    admitted: dict[int, int] = {}
    stop = threading.Event()
    with redis_server() as server:
        assert server.process is not None
        pid = server.process.pid
        quotas = [
            FleetQuota("outage", server.url, config=config, member_id=f"m{i}", pace=True)
            for i in range(3)
        ]
        try:
            for quota, demand in zip(quotas, (150, 30, 20), strict=True):
                quota.demand(demand)
                quota.start()
            _spend(quotas, admitted, stop)
            worst = _watch(quotas, 2.0)  # settling
            assert [round(q.grant) for q in quotas] == [150, 30, 20]
            os.kill(pid, signal.SIGSTOP)
            worst = max(worst, _watch(quotas, 4.0))
            assert all(q._member.fallen_back for q in quotas)
            os.kill(pid, signal.SIGCONT)
            worst = max(worst, _watch(quotas, 1.5))  # two refreshes of rebuild, and one
            assert not any(q._member.fallen_back for q in quotas)
            assert [round(q.grant) for q in quotas] == [150, 30, 20]
            worst = max(worst, _watch(quotas, 1.5))
        finally:
            stop.set()
            os.kill(pid, signal.SIGCONT)
            for quota in quotas:
                quota.close()
    assert worst <= 200 * MILLI
    seconds = sorted(admitted)[1:-1]  # whole seconds only
    assert max(admitted[s] for s in seconds) <= 200 + 3, admitted

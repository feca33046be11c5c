"""What the provider and the fleet's invariant see of a run of `ratewarden
simulate`, recorded in its `Result` as it goes: the requests admitted and
offered per provider window, the sum of the members' grants against the total
(everyone informed, and while some member has not heard of a cut), the reach of
a change of the total, how late joiners converge, how soon members started
before the coordinator answered hold their share, and how dead members are
reclaimed. `Run` (`_run`) drives the members and their callers; what it sees
goes through these."""

from __future__ import annotations

import math
from typing import Protocol

from ..fleet.alloc import MILLI, allocate, with_spare
from ._backend import Backend, TrueClock
from ._node import Node
from ._plans import BURST_OFF, BURST_ON, Plan
from ._result import BINS, Result
from ._scenarios import Scenario

__all__ = ["CONVERGED", "Measures", "Progress"]

CONVERGED = 0.05  # a grant within 5% of its target


class Progress(Protocol):
    """Told how much simulated time has passed, a window at a time."""

    def advance(self, seconds: float) -> None: ...


class Measures:
    """What a run measures; `Run` is the rest. Made last, when the run knows
    its windows."""

    # what the run keeps (`Run`)
    s: Scenario
    plan: Plan
    clock: TrueClock
    backend: Backend
    progress: Progress | None
    nodes: list[Node]
    order: list[Node]  # live members in join order
    start: int
    window: int
    windows: int
    total: int
    eff: int  # the total in millipermits

    def __init__(self) -> None:
        scenario = self.s
        self.local_sum = 0
        self.coord_held = 0
        self.unheard: set[int] = set()  # live members that have not heard of the last cut
        self.cut_at = 0
        self.reach: dict[int, tuple[int, int]] | None = None  # member: refreshes when it changed
        self.reach_at = 0
        self.reach_seen: list[tuple[float, int]] = []
        self.dead: dict[int, tuple[int, int]] = {}  # member: died at, last refresh
        # when the coordinator first answers, and the members started before
        # that which do not hold their share yet
        self.answered_at = self.start + round(scenario.unreachable * 1e9)
        self.awaiting: set[int] = set()
        self.fleet_rate = 0.0
        self.offer_t = self.start
        self.r = Result(
            scenario,
            self.backend.label,
            admitted=[0] * self.windows,
            limits=[self.total] * self.windows,
            offered=[0.0] * self.windows,
            bins=[0] * (self.windows * BINS),
            warmup=min(self.windows // 2, math.ceil(scenario.warmup * 1e9 / self.window)),
            member_admitted=[0] * scenario.members,
            member_windows=[[0] * self.windows for _ in range(scenario.members)],
        )

    # -- the provider ----------------------------------------------------------------

    def _admit(self, node: Node) -> None:
        offset = self.clock.now - self.start
        k = offset // self.window
        if k < self.windows:
            self.r.admitted[k] += 1
            self.r.times.append(offset)
            self.r.bins[offset * BINS // self.window] += 1
            self.r.member_windows[node.index][k] += 1
            if k >= self.r.warmup:
                self.r.member_admitted[node.index] += 1

    def _flush_offer(self) -> None:
        """Adds what the callers offered since the last change to the windows."""
        t0, t1, rate = self.offer_t, self.clock.now, self.fleet_rate
        self.offer_t = t1
        while rate > 0 and t0 < t1:
            k = (t0 - self.start) // self.window
            edge = min(t1, self.start + (k + 1) * self.window)
            if k < self.windows:
                self.r.offered[k] += rate * (edge - t0) / 1e9
            t0 = edge

    # -- the invariant ---------------------------------------------------------------

    def _check_coordinator(self, held: int, eff: int) -> None:
        if eff <= 0:
            return
        ratio = held / eff
        self.r.coord_max = max(self.r.coord_max, ratio)
        if held > eff:
            self.r.coord_violations += 1

    def _set_local(self, node: Node, value: int) -> None:
        if value == node.local:
            return
        self.local_sum += value - node.local
        node.local = value
        if value > 0:
            self._check_local()
        if self.awaiting:
            self._holds(node)

    def _check_local(self) -> None:
        if self.eff <= 0:
            return
        ratio = self.local_sum / self.eff
        r = self.r
        if self.unheard:
            r.local_max_cut = max(r.local_max_cut, ratio)
            if self.local_sum > self.eff:
                r.local_violations_cut += 1
        else:
            r.local_max = max(r.local_max, ratio)
            if self.local_sum > self.eff:
                r.local_violations += 1

    def _record_grant(self, node: Node) -> None:
        member = node.member
        assert member is not None
        points = self.r.grants.setdefault(node.id, [])
        point = ((self.clock.now - self.start) / 1e9, member.grant)
        if not points or points[-1][1] != point[1]:
            points.append(point)

    # -- cuts and reach --------------------------------------------------------------

    def _heard(self, node: Node) -> None:
        """Whether the member knows the current total now; the bookkeeping of cuts
        and of a change's reach."""
        member = node.member
        assert member is not None
        known = member.known or {}
        if known.get("eff_m") != str(self.eff):
            return
        if node.index in self.unheard:
            self.unheard.discard(node.index)
            if not self.unheard:
                self.r.cut_unheard_ms = max(
                    self.r.cut_unheard_ms, (self.clock.now - self.cut_at) / 1e6
                )
        if self.reach is not None and node.index in self.reach:
            refreshes, _ = self.reach.pop(node.index)
            self.reach_seen.append(
                ((self.clock.now - self.reach_at) / 1e9, node.refreshes - refreshes)
            )
            self._reach_done()

    def _reach_done(self) -> None:
        if self.reach is None or self.reach:
            return
        seen = self.reach_seen
        self.r.reaches.append(
            {
                "at": (self.reach_at - self.start) / 1e9,
                "total": self.total,
                "seconds": max((s for s, _ in seen), default=0.0),
                "refreshes": max((r for _, r in seen), default=0),
                "members": len(seen),
            }
        )
        self.reach = None

    # -- convergence, reclaim --------------------------------------------------------

    def _target(self, node: Node) -> int:
        """The node's share of the total over the true demands of the live members."""
        per_window = self.window / 1e9 * MILLI
        if self.plan.bursts is None:
            wants = [round(n.rate * per_window) for n in self.order]
        else:  # its average
            share = BURST_ON / (BURST_ON + BURST_OFF)
            wants = [round(self.plan.rates[n.index] * share * per_window) for n in self.order]
        mine = self.order.index(node)
        if self.s.algorithm == "static":
            cap = int(self.s.config().fields()["cap_m"])
            return allocate(self.s.algorithm, self.eff, wants, cap)[mine]
        return with_spare(self.s.algorithm, self.eff, wants)[mine]

    def _converged(self, node: Node) -> None:
        member = node.member
        assert member is not None
        target = self._target(node)
        grant = round(member.grant * MILLI)
        if abs(grant - target) <= CONVERGED * target:
            node.tracked = False
            self.r.convergence.append(
                {
                    "member": node.id,
                    "refreshes": node.refreshes - node.joined_refreshes,
                    "seconds": (self.clock.now - node.joined_at) / 1e9,
                    "target": target / MILLI,
                }
            )

    def _holds(self, node: Node) -> None:
        """A member started before the coordinator answered spends its share
        (within 5% of its target) after it answered."""
        if node.index not in self.awaiting or self.clock.now < self.answered_at:
            return
        target = self._target(node)
        if node.member is not None and abs(node.local - target) <= CONVERGED * target:
            self.awaiting.discard(node.index)
            self.r.answered.append(
                {
                    "member": node.id,
                    "seconds": (self.clock.now - self.answered_at) / 1e9,
                    "refreshes": node.refreshes,  # all since it answered: none got through before
                    "target": target / MILLI,
                }
            )

    def _reclaimed(self) -> None:
        for index, (died, last) in list(self.dead.items()):
            node = self.nodes[index]
            if not self.backend.holds(node.id):
                del self.dead[index]
                now = self.clock.now
                self.r.reclaims.append(
                    {
                        "member": node.id,
                        "after_death": (now - died) / 1e9,
                        "after_last_refresh": (now - last) / 1e9,
                        "lease": self.s.lease,
                    }
                )

    def _tick(self, k: int) -> None:
        self.r.held.append((self.coord_held / MILLI, self.local_sum / MILLI))
        if self.progress is not None:
            self.progress.advance(self.window / 1e9)
        if k == self.windows:  # the end: who never converged, who was never reclaimed
            for node in self.nodes:
                if node.tracked:
                    self.r.convergence.append(
                        {"member": node.id, "refreshes": None, "seconds": None, "target": None}
                    )
            for index in sorted(self.awaiting):
                self.r.answered.append(
                    {"member": self.nodes[index].id, "seconds": None, "refreshes": None}
                )
            self.awaiting.clear()
            for index in self.dead:
                self.r.reclaims.append(
                    {
                        "member": self.nodes[index].id,
                        "after_death": None,
                        "after_last_refresh": None,
                        "lease": self.s.lease,
                    }
                )
            self.dead.clear()

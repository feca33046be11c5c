"""The simulation's event loop: a heap of integer-nanosecond events, played in
order on the true clock; the members joining, refreshing, hearing the
coordinator's messages and departing; their callers arriving, waiting and
giving up; the operator changing the total (see `_command` for what each does
as the real thing would). What the provider and the invariant see is recorded
by `Measures` (`_measure`), a base of `Run`."""

from __future__ import annotations

import heapq
import random
import time
from typing import Any

from ..fleet.alloc import MILLI
from ..fleet.member import Member
from ..primitives import StoreUnavailable
from ._backend import BackendFactory, TrueClock, Unreachable, _MemberClock
from ._measure import Measures, Progress
from ._node import Node
from ._plans import BURST_OFF, BURST_ON, Plan, make_plan
from ._result import Result
from ._scenarios import Scenario

__all__ = ["START_S", "Progress", "Run"]

START_S = 1_763_900_000  # the virtual clock starts at this epoch second (rounded to a window)

(ARRIVE, SERVE, REFRESH, MESSAGE, ACTIVATE, JOIN, LEAVE, DIE, TOTAL, BURST, TICK, DUE, WORK) = (
    range(13)
)


class Run(Measures):
    """One scenario's run: `run` plays its events in order and returns its `Result`."""

    def __init__(
        self,
        scenario: Scenario,
        backend: BackendFactory,
        progress: Progress | None = None,
    ) -> None:
        self.s = scenario
        self.rng = random.Random(scenario.seed)
        self.plan: Plan = make_plan(scenario, self.rng)
        self.window = scenario.window_ns
        self.start = START_S * 10**9 // self.window * self.window
        self.end = self.start + round(scenario.seconds * 1e9)
        self.windows = -(-(self.end - self.start) // self.window)
        self.clock = TrueClock(self.start)
        self.backend = backend(self.clock)
        if scenario.unreachable:
            until = self.start + round(scenario.unreachable * 1e9)
            self.backend = Unreachable(self.backend, self.clock, until)
        self.progress = progress
        self.max_wait = round(scenario.wait * 1e9)
        self.nodes = [
            Node(i, skew, _MemberClock(self.clock, skew))
            for i, skew in enumerate(self.plan.skews_ns)
        ]
        self.order: list[Node] = []  # live members in join order, as the coordinator sorts
        self.heap: list[tuple[int, int, int, int, Any]] = []
        self.seq = 0
        self.total = scenario.total
        self.eff = self.total * MILLI
        super().__init__()  # last: what is measured is sized by the windows

    # -- events ----------------------------------------------------------------------

    def push(self, at: int, kind: int, index: int, arg: Any = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, kind, index, arg))

    def _schedule_plan(self) -> None:
        plan, start = self.plan, self.start
        if not self.s.unreachable:  # else the members create it, from their config
            self.backend.set(self.s.config())  # the operator creates the resource
        for i, at in enumerate(plan.joins):
            self.push(start + round(at * 1e9), JOIN, i)
        for i, at in plan.leaves.items():
            self.push(start + round(at * 1e9), LEAVE, i)
        for i, at in plan.deaths.items():
            self.push(start + round(at * 1e9), DIE, i)
        for at, total in plan.totals:
            self.push(start + round(at * 1e9), TOTAL, 0, total)
            k = round(at * 1e9) // self.window
            for w in range(k, self.windows):
                self.r.limits[w] = total
        for k in range(1, self.windows):  # the last one is the end's (run)
            self.push(start + k * self.window, TICK, 0, k)

    def run(self) -> Result:
        wall = time.perf_counter()
        self._schedule_plan()
        heap, nodes, end = self.heap, self.nodes, self.end
        events = 0
        try:
            while heap:
                at, _, kind, index, arg = heapq.heappop(heap)
                if at >= end:
                    break
                self.clock.now = at
                events += 1
                self._play(kind, nodes[index], arg)
            self.clock.now = end
            self._flush_offer()
            self._tick(self.windows)
        finally:
            self.backend.close()
        self.r.events = events
        self.r.waiting_at_end = sum(len(n.queue) + n.due for n in nodes)
        self.r.wall = time.perf_counter() - wall
        self.r.roles = {n.id: self.plan.role(n.index) for n in nodes}
        return self.r

    def _play(self, kind: int, node: Node, arg: Any) -> None:
        """One event, on the true clock's ``now``."""
        if kind == ARRIVE:
            if arg == node.arrive_gen:
                self._arrive(node)
        elif kind == WORK:
            if arg[0] == node.arrive_gen and node.alive:
                self._arrive(node, arg[1])
        elif kind == SERVE:
            if arg == node.serve_gen:
                self._serve(node)
        elif kind == DUE:
            self._due(node, *arg)
        elif kind == REFRESH:
            if arg == node.refresh_gen and node.alive:
                self._refresh(node)
                self._schedule_refresh(node)
        elif kind == MESSAGE:
            self._message(node, arg)
        elif kind == ACTIVATE:
            self._activate(node, arg)
        elif kind == JOIN:
            self._join(node)
        elif kind in (LEAVE, DIE):
            self._depart(node, clean=kind == LEAVE)
        elif kind == TOTAL:
            self._change_total(arg)
        elif kind == BURST:
            if arg == node.arrive_gen and node.alive:
                self._burst(node)
        else:
            self._tick(arg)

    # -- callers ---------------------------------------------------------------------

    def _arrive(self, node: Node, caller: int = -1) -> None:
        """A call of `acquire(max_wait)`: an open-loop arrival, or a worker
        (``caller``, 0 and up) asking again."""
        member = node.member
        assert member is not None
        now = self.clock.now
        t = now + node.skew
        share = member.share
        share.ask(t, 1, caller if caller >= 0 else None)
        self.r.arrivals += 1
        wait = share.take(t, 1)
        if not wait:
            self._admit(node)
            self._finished(node, caller)
        elif wait > self.max_wait:
            self.r.gave_up += 1
            self._finished(node, caller)
        else:
            self.r.waited += 1
            if node.queue:  # first come, first served: behind the others
                node.queue.append((t + self.max_wait, t, caller))
            else:
                held, wait = share.reserve(t, 1, self.max_wait)
                if held:
                    node.due += 1
                    self.push(now + wait, DUE, node.index, (node.serve_gen, t, caller))
                elif wait > self.max_wait:
                    self.r.gave_up += 1
                    self._finished(node, caller)
                else:
                    node.queue.append((t + self.max_wait, t, caller))
                    if not node.serving:
                        node.serving = True
                        self.push(now + wait, SERVE, node.index, node.serve_gen)
        if caller < 0:
            self._next_arrival(node)

    def _finished(self, node: Node, caller: int) -> None:
        """A call returned (served or given up): a worker asks again after its
        think time."""
        if caller >= 0 and node.member is not None:
            node.member.share.done(self.clock.now + node.skew, caller)
            think = round(self.s.think_ms * 1e6)
            self.push(self.clock.now + think, WORK, node.index, (node.arrive_gen, caller))

    def _next_arrival(self, node: Node) -> None:
        if self.s.arrivals == "even":
            gap = 1e9 / node.rate
        else:
            gap = self.rng.expovariate(node.rate) * 1e9
        self.push(self.clock.now + max(1, round(gap)), ARRIVE, node.index, node.arrive_gen)

    def _serve(self, node: Node) -> None:
        """The waiting callers, oldest first, reserve their permits as
        `FleetQuota.acquire` does (`Share.reserve`), each then admitted when its
        permit falls due; the first that cannot reserve one waits for the time
        it is told, or gives up if that falls after its deadline, and the ones
        behind it wait with it."""
        member = node.member
        assert member is not None
        node.serving = False
        now = self.clock.now
        t = now + node.skew
        share = member.share
        queue = node.queue
        while queue:
            deadline, since, caller = queue[0]
            held, wait = share.reserve(t, 1, deadline - t)
            if held:
                queue.popleft()
                node.due += 1
                if wait:
                    self.push(now + wait, DUE, node.index, (node.serve_gen, since, caller))
                else:
                    self._due(node, node.serve_gen, since, caller)
                continue
            while queue and t + wait > queue[0][0]:
                _, _, caller = queue.popleft()
                self.r.gave_up += 1
                self._finished(node, caller)
            if queue:
                node.serving = True
                self.push(now + wait, SERVE, node.index, node.serve_gen)
            break

    def _activate(self, node: Node, gen: int) -> None:
        """A window edge where a member's pending grant applies."""
        if gen == node.act_gen and node.member is not None:
            node.member.share.window_state(node.clock.time_ns())
            self._set_local(node, node.member.share.grant)

    def _due(self, node: Node, gen: int, since: int, caller: int) -> None:
        """A waiting caller's reserved permit is due: it goes to the provider."""
        if gen != node.serve_gen or node.member is None:
            return  # its member left or died meanwhile (counted as given up then)
        node.due -= 1
        t = self.clock.now + node.skew
        self.r.wait_ns += t - since
        self._admit(node)
        self._finished(node, caller)

    def _set_rate(self, node: Node, rate: float, *, arrivals: bool = True) -> None:
        """A member's callers offer ``rate`` a second from now; ``arrivals``:
        open-loop ones, whose arrivals start here (workers start themselves)."""
        self._flush_offer()
        self.fleet_rate += rate - node.rate
        node.rate = rate
        node.arrive_gen += 1
        if rate > 0 and node.alive and arrivals:
            if self.s.arrivals == "even":  # a random phase, then evenly spaced
                gap = self.rng.uniform(0, 1e9 / rate)
            else:
                gap = self.rng.expovariate(rate) * 1e9
            self.push(self.clock.now + round(gap), ARRIVE, node.index, node.arrive_gen)

    def _burst(self, node: Node) -> None:
        """An on/off switch of a member's callers (the bursts pattern)."""
        phase = self.plan.bursts
        assert phase is not None
        period = BURST_ON + BURST_OFF
        elapsed = (self.clock.now - self.start) / 1e9 - phase[node.index]
        into = elapsed % period
        node.on = into < BURST_ON
        self._set_rate(node, self.plan.rates[node.index] if node.on else 0.0)
        left = (BURST_ON - into) if node.on else (period - into)
        self.push(self.clock.now + max(1, round(left * 1e9)), BURST, node.index, node.arrive_gen)

    # -- members ---------------------------------------------------------------------

    def _join(self, node: Node) -> None:
        """`FleetQuota.start`: one refresh, then one more with an equal share's demand."""
        node.member = member = Member(
            "simulated",
            node.clock,
            member_id=node.id,
            pace=self.s.pace,
            config=self.s.config(total=self.total),  # as stored now
        )
        node.joined_at = self.clock.now
        self.order.append(node)
        if self.clock.now < self.answered_at:
            self.awaiting.add(node.index)
        self._refresh(node)
        if member.known is not None:
            self._refresh(node)
        node.joined_refreshes = node.refreshes
        node.tracked = node.index in self.plan.late
        if node.tracked:
            self._converged(node)
        self._schedule_refresh(node)
        workers = self.plan.workers[node.index]
        if workers:
            self._set_rate(node, self.plan.rates[node.index], arrivals=False)
            for caller in range(workers):  # a pool started together, in a random order
                at = self.clock.now + round(self.rng.uniform(0, 1e6))
                self.push(at, WORK, node.index, (node.arrive_gen, caller))
        elif self.plan.bursts is not None:
            self._burst(node)
        else:
            self._set_rate(node, self.plan.rates[node.index])

    def _schedule_refresh(self, node: Node) -> None:
        node.refresh_gen += 1
        assert node.member is not None
        delay = node.member.next_delay(self.rng.uniform(0.9, 1.1))
        self.push(self.clock.now + round(delay * 1e9), REFRESH, node.index, node.refresh_gen)

    def _refresh(self, node: Node) -> None:
        member = node.member
        assert member is not None
        report = member.report()
        sent_at = node.clock.time_ns()
        try:
            reply = self.backend.refresh(member.id, report)
        except StoreUnavailable as exc:  # tries again at its next interval, as the quota does
            member.on_failure(exc)
            self._applied(node)
            return
        if reply is None:
            raise RuntimeError("the simulated resource vanished from the coordinator")
        self.r.refreshes += 1
        self.coord_held = reply.held
        self._check_coordinator(reply.held, reply.effective_total)
        member.on_reply(reply, sent_at)
        if self.s.pubsub:
            delay = round(self.s.pubsub_ms * 1e6)
            for message in self.backend.messages(reply):
                for n in self.order:
                    self.push(self.clock.now + delay, MESSAGE, n.index, message)
        node.refreshes += 1
        node.last_refresh = self.clock.now
        self._applied(node)
        self._heard(node)
        if node.tracked:
            self._converged(node)
        if self.awaiting:
            self._holds(node)
        if self.dead:
            self._reclaimed()

    def _message(self, node: Node, data: Any) -> None:
        member = node.member
        if member is None:
            return
        asked = member.on_message(data)
        self._applied(node)
        self._heard(node)
        if asked:  # FleetQuota's loop refreshes at once, and counts its interval anew
            self._refresh(node)
            self._schedule_refresh(node)

    def _applied(self, node: Node) -> None:
        """The member's grant may have changed: a smaller one spends at once, a
        larger one from its next window edge (an event then)."""
        member = node.member
        assert member is not None
        share = member.share
        node.act_gen += 1
        if share.pending is not None:
            t = node.clock.time_ns()
            edge = (t // share.window_ns + 1) * share.window_ns
            self.push(edge - node.skew, ACTIVATE, node.index, node.act_gen)
        self._set_local(node, share.grant)
        self._record_grant(node)

    def _depart(self, node: Node, *, clean: bool) -> None:
        member = node.member
        if member is None:
            return
        self._set_rate(node, 0.0)
        node.member = None
        node.serve_gen += 1
        node.refresh_gen += 1
        node.act_gen += 1
        node.serving = False
        self.r.gave_up += len(node.queue) + node.due
        node.queue.clear()
        node.due = 0
        self._set_local(node, 0)
        self.order.remove(node)
        self.unheard.discard(node.index)
        if self.reach is not None:
            self.reach.pop(node.index, None)
            self._reach_done()
        self.r.departed[node.id] = (self.clock.now - self.start) / 1e9
        if clean:
            self.backend.leave(member.id)
        else:
            self.dead[node.index] = (self.clock.now, node.last_refresh)

    # -- the total -------------------------------------------------------------------

    def _change_total(self, total: int) -> None:
        old = self.eff
        messages = self.backend.set(self.s.config(total=total))
        self.total, self.eff = total, total * MILLI
        held, eff = self.backend.held()
        self.coord_held = held
        self._check_coordinator(held, eff)
        live = list(self.order)
        if self.eff < old:
            self.unheard = {n.index for n in live}
            self.cut_at = self.clock.now
            self._check_local()
        self.reach = {n.index: (n.refreshes, 0) for n in live}
        self.reach_at = self.clock.now
        self.reach_seen = []
        if self.s.pubsub:
            delay = round(self.s.pubsub_ms * 1e6)
            for message in messages:
                for n in live:
                    self.push(self.clock.now + delay, MESSAGE, n.index, message)
        if self.dead:
            self._reclaimed()

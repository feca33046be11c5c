"""`ratewarden simulate`: a fleet of up to 200 members on a virtual clock, against
the coordinator's Python model or the real ``fleet.lua`` in a Redis, and what the
provider at the other end would see.

The simulation is event-driven (a heap of integer-nanosecond events); nothing
sleeps. Each member is a real `Member` (its `Share` included) on a clock of its
own, offset from the true time by its skew; the coordinator reads the true time
(the model is called with it, the script gets it through `Coordinator`'s clock).

- Refreshes: a member joins as `FleetQuota.start` does (one refresh, one more
  with an equal share's demand), then refreshes every interval jittered by ±10%,
  at the instant it is due: a refresh takes no time.
- The coordinator's messages (a change of the total): what it published (the
  model's ``published``; on Redis, the message read from a real subscription)
  reaches every live member ``pubsub_ms`` later; the member scales its grant and
  refreshes at once, as `FleetQuota`'s loop does. ``pubsub=False``: nobody hears,
  members learn at their next refresh.
- Requests: open-loop arrivals per member (Poisson, or evenly spaced). Each one
  is `acquire(max_wait)`: ``asked`` counted once, one `take`; if told to wait
  and the wait fits in ``max_wait`` the caller waits (`begin_wait`) and tries
  again when told. A member's waiting callers are served first come, first
  served: only the oldest tries again, the others behind it (real threads all
  wake and race; the permits spent and the give-ups are the same, and it keeps
  the events to about one per permit). A caller whose next try falls after its
  deadline gives up, as `acquire` raises `RateLimitTimeout`.
- The truth is the provider's: admitted requests counted per aligned window
  (second) of the true clock, and per hundredth of it (10 ms).

The figures each run reports (`Result`): the largest ratio of the grants' sum to
the total, the coordinator's (every reply's ``held``) and the members' (the
grants they spend, a larger one from the window edge it applies at), checked at
every change, the moments after a cut of the total while some member has not
heard of it told apart; provider windows over the limit; utilisation (admitted
over min(total, offered) in the windows after the warm-up); how many refreshes a
member that joined late needs to come within 5% of its target (the allocation of
the total over the true demands); when the coordinator drops a dead member;
when a change of the total has reached every member.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TextIO

from redis.exceptions import RedisError

from .._errors import ConfigurationError, RatewardenError, StoreUnavailable
from ._alloc import ALLOCATORS, MILLI, allocate
from ._config import QuotaConfig
from ._coord import Coordinator, Reply, keys, parse_refresh
from ._member import Member
from ._model import Model
from ._scenarios import (
    BINS,
    BURST_OFF,
    BURST_ON,
    PATTERNS,
    Plan,
    Result,
    Scenario,
    check,
    documented,
    make_plan,
)

__all__ = [
    "Backend",
    "ModelBackend",
    "RedisBackend",
    "add_arguments",
    "documented",
    "main",
    "simulate",
]

START_S = 1_763_900_000  # the virtual clock starts at this epoch second (rounded to a window)
CONVERGED = 0.05  # a grant within 5% of its target


# -- clocks ---------------------------------------------------------------------


class TrueClock:
    """The simulation's time: the provider's, and the coordinator's."""

    def __init__(self, now: int) -> None:
        self.now = now

    def time_ns(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        raise RuntimeError("nothing sleeps in a simulation")

    async def asleep(self, seconds: float) -> None:
        raise RuntimeError("nothing sleeps in a simulation")


class _MemberClock(TrueClock):
    """A member's clock: the true time plus its skew."""

    def __init__(self, true: TrueClock, offset: int) -> None:
        super().__init__(0)
        self.true, self.offset = true, offset

    def time_ns(self) -> int:
        return self.true.now + self.offset


# -- the coordinator --------------------------------------------------------------


class Backend(Protocol):
    """The coordinator the members talk to, at the simulation's true time."""

    label: str

    def set(self, config: QuotaConfig) -> list[Any]:
        """Create or change the resource; the messages it published."""
        ...

    def refresh(
        self,
        member: str,
        *,
        wants: int,
        has: int,
        used: int,
        throttled: int,
        restore: dict[str, str] | None,
    ) -> Reply | None: ...

    def leave(self, member: str) -> None: ...

    def holds(self, member: str) -> bool:
        """Whether the coordinator still keeps the member's record (no side effect)."""
        ...

    def held(self) -> tuple[int, int]:
        """What the live members hold, summed, and the effective total (millipermits)."""
        ...

    def close(self) -> None: ...


class ModelBackend:
    """The coordinator's Python model (`Model`), called with the true time."""

    label = "model"

    def __init__(self, clock: TrueClock) -> None:
        self.clock = clock
        self.model = Model()
        self._seen = 0

    def _ms(self) -> int:
        return self.clock.now // 1_000_000

    def set(self, config: QuotaConfig) -> list[Any]:
        self.model.set(self._ms(), config.fields())
        published = self.model.published[self._seen :]
        self._seen = len(self.model.published)
        return list(published)

    def refresh(
        self,
        member: str,
        *,
        wants: int,
        has: int,
        used: int,
        throttled: int,
        restore: dict[str, str] | None,
    ) -> Reply | None:
        raw = self.model.refresh(
            self._ms(),
            member,
            wants=wants,
            reported=has,
            used=used,
            throttled=throttled,
            restore=restore,
        )
        return parse_refresh(raw)

    def leave(self, member: str) -> None:
        self.model.leave(member)

    def holds(self, member: str) -> bool:
        return member in self.model.members

    def held(self) -> tuple[int, int]:
        raw = self.model.show(self._ms())
        return sum(int(m[4]) for m in raw[3:]), int(self.model.cfg.get("eff_m", "0"))

    def close(self) -> None:
        return None


class RedisBackend:
    """``fleet.lua`` in a real Redis through `Coordinator`, on the true clock; the
    change messages read from a real subscription to the resource's channel."""

    label = "redis"

    def __init__(self, client: Any, clock: TrueClock, name: str) -> None:
        self.client = client
        self.coordinator = Coordinator(client, name, clock=clock)
        self._keys = keys(name)
        self._exists = False
        self.pubsub = client.pubsub()
        self.pubsub.subscribe(self.coordinator.channel)
        self._next("subscribe")

    def _next(self, kind: str) -> Any:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.5)
            if message is not None and message["type"] == kind:
                return message["data"]
        raise StoreUnavailable(f"redis: no {kind} on {self.coordinator.channel} within 5 s")

    def set(self, config: QuotaConfig) -> list[Any]:
        existed, self._exists = self._exists, True
        self.coordinator.set(config)
        return [self._next("message")] if existed else []  # a change is always published

    def refresh(
        self,
        member: str,
        *,
        wants: int,
        has: int,
        used: int,
        throttled: int,
        restore: dict[str, str] | None,
    ) -> Reply | None:
        return self.coordinator.refresh(
            member, wants=wants, has=has, used=used, throttled=throttled, restore=restore
        )

    def leave(self, member: str) -> None:
        self.coordinator.leave(member)

    def holds(self, member: str) -> bool:
        return bool(self.client.hexists(self._keys[1], member))

    def held(self) -> tuple[int, int]:
        status = self.coordinator.show()
        if status is None:
            return 0, 0
        held = sum(round(m.has * MILLI) for m in status.members)
        return held, round(status.effective_total * MILLI)

    def close(self) -> None:
        try:
            self.pubsub.close()
        finally:
            self.client.delete(*self._keys)


BackendFactory = Callable[[TrueClock], Backend]


# -- the simulation ---------------------------------------------------------------

ARRIVE, SERVE, REFRESH, MESSAGE, ACTIVATE, JOIN, LEAVE, DIE, TOTAL, BURST, TICK = range(11)


class _Node:
    """One simulated member: its `Member`, its callers, its bookkeeping."""

    __slots__ = (
        "act_gen",
        "admitted",
        "arrive_gen",
        "clock",
        "id",
        "index",
        "joined_at",
        "joined_refreshes",
        "last_refresh",
        "local",
        "member",
        "on",
        "queue",
        "rate",
        "refresh_gen",
        "refreshes",
        "serve_gen",
        "serving",
        "skew",
        "tracked",
    )

    def __init__(self, index: int, skew: int, clock: _MemberClock) -> None:
        self.index = index
        self.id = f"member-{index:03d}"
        self.skew = skew
        self.clock = clock
        self.member: Member | None = None
        self.rate = 0.0  # arrivals a second now
        self.on = True
        self.queue: deque[tuple[int, int]] = deque()  # waiting callers: deadline, since
        self.serving = False
        self.arrive_gen = self.refresh_gen = self.serve_gen = self.act_gen = 0
        self.local = 0  # the grant it spends now, millipermits
        self.refreshes = self.joined_refreshes = 0
        self.joined_at = self.last_refresh = 0
        self.admitted = 0
        self.tracked = False  # convergence measured for it

    @property
    def alive(self) -> bool:
        return self.member is not None


class _Run:
    def __init__(
        self,
        scenario: Scenario,
        backend: BackendFactory,
        progress: _Progress | None = None,
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
        self.progress = progress
        self.max_wait = round(scenario.wait * 1e9)
        self.nodes = [
            _Node(i, skew, _MemberClock(self.clock, skew))
            for i, skew in enumerate(self.plan.skews_ns)
        ]
        self.order: list[_Node] = []  # live members in join order, as the coordinator sorts
        self.heap: list[tuple[int, int, int, int, Any]] = []
        self.seq = 0
        self.total = scenario.total
        self.eff = self.total * MILLI
        self.local_sum = 0
        self.coord_held = 0
        self.unheard: set[int] = set()  # live members that have not heard of the last cut
        self.cut_at = 0
        self.reach: dict[int, tuple[int, int]] | None = None  # member: refreshes when it changed
        self.reach_at = 0
        self.reach_seen: list[tuple[float, int]] = []
        self.dead: dict[int, tuple[int, int]] = {}  # member: died at, last refresh
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
        )

    # -- events --------------------------------------------------------------------

    def push(self, at: int, kind: int, index: int, arg: Any = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, kind, index, arg))

    def _schedule_plan(self) -> None:
        plan, start = self.plan, self.start
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
                node = nodes[index]
                if kind == ARRIVE:
                    if arg == node.arrive_gen:
                        self._arrive(node)
                elif kind == SERVE:
                    if arg == node.serve_gen:
                        self._serve(node)
                elif kind == REFRESH:
                    if arg == node.refresh_gen and node.alive:
                        self._refresh(node)
                        self._schedule_refresh(node)
                elif kind == MESSAGE:
                    self._message(node, arg)
                elif kind == ACTIVATE:
                    if arg == node.act_gen and node.member is not None:
                        node.member.share.window_state(node.clock.time_ns())
                        self._set_local(node, node.member.share.grant)
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
            self.clock.now = end
            self._flush_offer()
            self._tick(self.windows)
        finally:
            self.backend.close()
        self.r.events = events
        self.r.waiting_at_end = sum(len(n.queue) for n in nodes)
        self.r.wall = time.perf_counter() - wall
        self.r.roles = {n.id: self.plan.role(n.index) for n in nodes}
        return self.r

    # -- callers ---------------------------------------------------------------------

    def _arrive(self, node: _Node) -> None:
        member = node.member
        assert member is not None
        now = self.clock.now
        t = now + node.skew
        share = member.share
        share.asked += 1
        self.r.arrivals += 1
        wait = share.take(t, 1)
        if not wait:
            self._admit(node)
        elif wait > self.max_wait:
            self.r.gave_up += 1
        else:
            self.r.waited += 1
            share.begin_wait(t)
            node.queue.append((t + self.max_wait, t))
            if not node.serving:
                node.serving = True
                self.push(now + wait, SERVE, node.index, node.serve_gen)
        self._next_arrival(node)

    def _next_arrival(self, node: _Node) -> None:
        if self.s.arrivals == "even":
            gap = 1e9 / node.rate
        else:
            gap = self.rng.expovariate(node.rate) * 1e9
        self.push(self.clock.now + max(1, round(gap)), ARRIVE, node.index, node.arrive_gen)

    def _serve(self, node: _Node) -> None:
        """The oldest waiting caller tries again; the ones behind it follow while
        permits come, and give up once their next try would fall after their
        deadline."""
        member = node.member
        assert member is not None
        node.serving = False
        now = self.clock.now
        t = now + node.skew
        share = member.share
        queue = node.queue
        while queue:
            wait = share.take(t, 1)
            if not wait:
                _, since = queue.popleft()
                share.end_wait(t)
                self.r.wait_ns += t - since
                self._admit(node)
                continue
            while queue and t + wait > queue[0][0]:
                queue.popleft()
                share.end_wait(t)
                self.r.gave_up += 1
            if queue:
                node.serving = True
                self.push(now + wait, SERVE, node.index, node.serve_gen)
            break

    def _admit(self, node: _Node) -> None:
        offset = self.clock.now - self.start
        k = offset // self.window
        if k < self.windows:
            self.r.admitted[k] += 1
            self.r.bins[offset * BINS // self.window] += 1
            if k >= self.r.warmup:
                self.r.member_admitted[node.index] += 1

    def _set_rate(self, node: _Node, rate: float) -> None:
        self._flush_offer()
        self.fleet_rate += rate - node.rate
        node.rate = rate
        node.arrive_gen += 1
        if rate > 0 and node.alive:
            if self.s.arrivals == "even":  # a random phase, then evenly spaced
                gap = self.rng.uniform(0, 1e9 / rate)
            else:
                gap = self.rng.expovariate(rate) * 1e9
            self.push(self.clock.now + round(gap), ARRIVE, node.index, node.arrive_gen)

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

    def _burst(self, node: _Node) -> None:
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

    def _join(self, node: _Node) -> None:
        """`FleetQuota.start`: one refresh, then one more with an equal share's demand."""
        node.member = member = Member(
            "simulated", node.clock, member_id=node.id, pace=self.s.pace, config=self.s.config()
        )
        node.joined_at = self.clock.now
        self.order.append(node)
        self._refresh(node)
        if member.known is not None:
            self._refresh(node)
        node.joined_refreshes = node.refreshes
        node.tracked = node.index in self.plan.late
        if node.tracked:
            self._converged(node)
        self._schedule_refresh(node)
        if self.plan.bursts is not None:
            self._burst(node)
        else:
            self._set_rate(node, self.plan.rates[node.index])

    def _schedule_refresh(self, node: _Node) -> None:
        node.refresh_gen += 1
        delay = self.s.refresh * self.rng.uniform(0.9, 1.1)  # as Member.next_delay
        self.push(self.clock.now + round(delay * 1e9), REFRESH, node.index, node.refresh_gen)

    def _refresh(self, node: _Node) -> None:
        member = node.member
        assert member is not None
        wants, has, used, throttled, restore = member.report()
        sent_at = node.clock.time_ns()
        reply = self.backend.refresh(
            member.id, wants=wants, has=has, used=used, throttled=throttled, restore=restore
        )
        if reply is None:
            raise RuntimeError("the simulated resource vanished from the coordinator")
        self.r.refreshes += 1
        self.coord_held = reply.held
        self._check_coordinator(reply.held, reply.effective_total)
        member.on_reply(reply, sent_at)
        node.refreshes += 1
        node.last_refresh = self.clock.now
        self._applied(node)
        self._heard(node)
        if node.tracked:
            self._converged(node)
        if self.dead:
            self._reclaimed()

    def _message(self, node: _Node, data: Any) -> None:
        member = node.member
        if member is None:
            return
        asked = member.on_message(data)
        self._applied(node)
        self._heard(node)
        if asked:  # FleetQuota's loop refreshes at once, and counts its interval anew
            self._refresh(node)
            self._schedule_refresh(node)

    def _depart(self, node: _Node, *, clean: bool) -> None:
        member = node.member
        if member is None:
            return
        self._set_rate(node, 0.0)
        node.member = None
        node.serve_gen += 1
        node.refresh_gen += 1
        node.act_gen += 1
        node.serving = False
        self.r.gave_up += len(node.queue)
        node.queue.clear()
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

    def _heard(self, node: _Node) -> None:
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

    # -- the invariant -----------------------------------------------------------------

    def _check_coordinator(self, held: int, eff: int) -> None:
        if eff <= 0:
            return
        ratio = held / eff
        self.r.coord_max = max(self.r.coord_max, ratio)
        if held > eff:
            self.r.coord_violations += 1

    def _applied(self, node: _Node) -> None:
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

    def _set_local(self, node: _Node, value: int) -> None:
        if value == node.local:
            return
        self.local_sum += value - node.local
        node.local = value
        if value > 0:
            self._check_local()

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

    def _record_grant(self, node: _Node) -> None:
        member = node.member
        assert member is not None
        points = self.r.grants.setdefault(node.id, [])
        point = ((self.clock.now - self.start) / 1e9, member.grant)
        if not points or points[-1][1] != point[1]:
            points.append(point)

    # -- convergence, reclaim ------------------------------------------------------------

    def _target(self, node: _Node) -> int:
        """The node's share of the total over the true demands of the live members."""
        per_window = self.window / 1e9 * MILLI
        if self.plan.bursts is None:
            wants = [round(n.rate * per_window) for n in self.order]
        else:  # its average
            share = BURST_ON / (BURST_ON + BURST_OFF)
            wants = [round(self.plan.rates[n.index] * share * per_window) for n in self.order]
        cap = int(self.s.config().fields()["cap_m"])
        return allocate(self.s.algorithm, self.eff, wants, cap)[self.order.index(node)]

    def _converged(self, node: _Node) -> None:
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


def simulate(
    scenario: Scenario,
    backend: BackendFactory | None = None,
    progress: _Progress | None = None,
) -> Result:
    """Run one scenario; on the coordinator's model unless ``backend`` says otherwise."""
    return _Run(scenario, backend or ModelBackend, progress).run()


# -- output ---------------------------------------------------------------------------


class _Progress:
    """A progress bar on stderr, drawn only when it is a terminal."""

    def __init__(self, total: float, stream: TextIO) -> None:
        self.total = max(total, 1e-9)
        self.stream = stream
        self.enabled = stream.isatty()
        self.done = 0.0
        self.label = ""
        self._drawn = 0.0

    def advance(self, seconds: float) -> None:
        self.done += seconds
        now = time.monotonic()
        if self.enabled and now - self._drawn >= 0.1:
            self._drawn = now
            filled = min(30, int(30 * self.done / self.total))
            self.stream.write(
                f"\r[{'#' * filled}{'.' * (30 - filled)}] {100 * self.done / self.total:3.0f}%"
                f" {self.label[:40]:<40}"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 80 + "\r")
            self.stream.flush()


def _row(key: str, r: Result) -> list[str]:
    conv = r.convergence_max
    reclaim = r.reclaim_max
    reach = r.reach_max
    return [
        key,
        r.scenario.algorithm,
        "yes" if r.scenario.pace else "no",
        f"{100 * r.utilisation:.1f}%",
        f"{len(r.over)}" + (f" ({r.max_excess:.1f}%)" if r.over else ""),
        f"{r.coord_max:.3f}",
        f"{r.local_max:.3f}",
        f"{r.local_max_cut:.3f}" if r.local_max_cut else "-",
        f"{r.bin_peak:.2f}",
        "-" if conv is None else ("never" if conv < 0 else str(conv)),
        "-" if reclaim is None else f"{reclaim:.2f}",
        "-" if reach is None else f"{reach[0] * 1000:.0f}ms/{reach[1]}",
        f"{r.wall:.1f}",
    ]


_HEADER = ["run", "algorithm", "paced", "util", "over", "coord", "members", "at cut",
           "10ms peak", "conv", "reclaim s", "reach", "wall s"]  # fmt: skip


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _explain(out: TextIO) -> None:
    print(
        "util: admitted / min(total, offered) after the warm-up; over: provider seconds over"
        " the limit (worst excess);\ncoord, members: the largest sum of grants / total (the"
        " coordinator's, the members' own); at cut: the members' while some had not heard of"
        " a cut;\n10ms peak: the fullest 10 ms of a saturated second over its mean; conv:"
        " refreshes until a late joiner is within 5% of its target;\nreclaim: seconds from a"
        " death to the coordinator dropping the member; reach: a change of the total to every"
        " member (time/refreshes)",
        file=out,
    )


# -- the command --------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ratewarden simulate``."""
    parser.description = (
        "Simulate a fleet of members sharing one quota on a virtual clock and report"
        " what the provider sees."
    )
    add = parser.add_argument
    add("--pattern", choices=PATTERNS, default="uniform",
        help="the demand: uniform, skewed (10:1), bursts (on/off), churn (join/leave/die),"
             " total-change (cut and raised), skew (clocks +-100 ms)")  # fmt: skip
    add("--members", type=int, default=8, help="members, 1-200 (default 8)")
    add("--total", default="2000/second",
        help="the fleet's total: a rate, or permits a second (default 2000/second)")  # fmt: skip
    add("--algorithm", choices=(*ALLOCATORS, "all"), default="fair_share",
        help="how the total is split; all: run each and compare")  # fmt: skip
    add("--seconds", type=float, default=60.0, help="simulated seconds (default 60)")
    add("--demand", type=float, default=1.5,
        help="the callers' offered load, a multiple of the total (default 1.5)")  # fmt: skip
    add("--pace", action=argparse.BooleanOptionalAction, default=True,
        help="spread each window's permits evenly (default: paced)")  # fmt: skip
    add("--skew-ms", type=float, default=None,
        help="clocks spread over +-this many ms (default 0; 100 for --pattern skew)")  # fmt: skip
    add("--seed", type=int, default=1)
    add("--refresh", type=float, default=1.0, help="seconds between refreshes (default 1)")
    add("--lease", type=float, default=5.0, help="seconds a lease lasts (default 5)")
    add("--max-wait", type=float, default=None,
        help="a caller's max_wait, seconds (default one window)")  # fmt: skip
    add("--active", type=int, default=None, help="only the first N members have demand")
    add("--pubsub", action=argparse.BooleanOptionalAction, default=True,
        help="deliver the coordinator's messages (default yes)")  # fmt: skip
    add("--pubsub-ms", type=float, default=1.0, help="their delay (default 1 ms)")
    add("--arrivals", choices=("poisson", "even"), default="poisson")
    add("--warmup", type=float, default=5.0,
        help="seconds left out of utilisation (default 5)")  # fmt: skip
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--model", action="store_true",
                       help="the coordinator's Python model (the default)")  # fmt: skip
    where.add_argument("--redis", metavar="URL", help="fleet.lua on this Redis")
    where.add_argument("--start-redis", action="store_true",
                       help="start a redis-server of our own on a free loopback port")  # fmt: skip
    add("--scenarios", action="store_true",
        help="run the documented scenarios (a)-(e) and check their figures")  # fmt: skip
    add("--plots", metavar="DIR", type=Path, help="write fleet-*.png plots into DIR")
    add("--json", action="store_true", help="print the results as JSON")


def _rate(text: str) -> str:
    return f"{text}/second" if text.strip().isdigit() else text


def scenarios_from(args: argparse.Namespace) -> list[Scenario]:
    """The runs the options ask for (one per algorithm with ``--algorithm all``)."""
    algorithms = ALLOCATORS if args.algorithm == "all" else (args.algorithm,)
    return [
        Scenario(
            pattern=args.pattern,
            members=args.members,
            rate=_rate(args.total),
            algorithm=algorithm,
            seconds=args.seconds,
            demand=args.demand,
            pace=args.pace,
            skew_ms=args.skew_ms,
            seed=args.seed,
            refresh=args.refresh,
            lease=args.lease,
            max_wait=args.max_wait,
            active=args.active,
            pubsub=args.pubsub,
            pubsub_ms=args.pubsub_ms,
            warmup=args.warmup,
            arrivals=args.arrivals,
        )
        for algorithm in algorithms
    ]


@contextmanager
def redis_server() -> Iterator[str]:
    """A redis-server of our own on a free loopback port (never 6379); its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise ConfigurationError("--start-redis needs redis-server on the PATH")
    with tempfile.TemporaryDirectory(prefix="rw-simulate-") as workdir:
        port = 6379
        while port == 6379:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
        process = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                        sock.sendall(b"PING\r\n")
                        if sock.recv(16).startswith(b"+PONG"):
                            break
                except OSError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise StoreUnavailable(f"redis-server on port {port} did not start")
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def coordinator(args: argparse.Namespace) -> Iterator[BackendFactory]:
    """The coordinator the options name: the model, a Redis, or one started here."""
    if not (args.redis or args.start_redis):
        yield ModelBackend
        return
    from ..stores.redis import connect  # noqa: PLC0415 - only with a Redis

    with _redis_url(args) as url:
        client = connect(url, 5.0)
        try:

            def factory(clock: TrueClock) -> Backend:
                return RedisBackend(client, clock, f"simulate-{uuid.uuid4().hex[:10]}")

            yield factory
        finally:
            client.close()


@contextmanager
def _redis_url(args: argparse.Namespace) -> Iterator[str]:
    if args.start_redis:
        with redis_server() as url:
            yield url
    else:
        yield str(args.redis)


def main(args: argparse.Namespace) -> int:
    """``ratewarden simulate``: 0, or 1 when a documented figure missed or an
    option was wrong."""
    try:
        return _main(args, sys.stdout, sys.stderr)
    except (RatewardenError, RedisError, OSError) as exc:
        print(f"ratewarden simulate: {exc}", file=sys.stderr)
        return 1


def _main(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.scenarios:
        runs = documented(args.seconds, args.seed)
    else:
        runs = {f"{s.pattern}/{s.algorithm}": s for s in scenarios_from(args)}
    twin: Scenario | None = None
    if args.plots is not None and not args.scenarios:
        first = next(iter(runs.values()))
        twin = first.but(pace=not first.pace)  # the pacing plot: the same run, both ways
    progress = _Progress(
        sum(s.seconds for s in runs.values()) + (twin.seconds if twin else 0.0), err
    )
    results: dict[str, Result] = {}
    try:
        with coordinator(args) as backend:
            for key, scenario in runs.items():
                progress.label = key
                results[key] = simulate(scenario, backend, progress)
            twin_result = simulate(twin, backend, progress) if twin is not None else None
    finally:
        progress.close()
    checks = check(results) if args.scenarios else []
    if args.json:
        json.dump(
            {
                "runs": {key: r.summary() for key, r in results.items()},
                "checks": [c.as_dict() for c in checks],
            },
            out,
            indent=1,
        )
        out.write("\n")
    else:
        first_result = next(iter(results.values()))
        print(f"{first_result.backend}: {len(results)} run(s)", file=out)
        print(table([_HEADER, *(_row(k, r) for k, r in results.items())]), file=out)
        _explain(out)
        if checks:
            print(file=out)
            rows = [["fig", "what", "measured", "target", ""]]
            rows += [
                [c.figure, c.what, c.measured, c.target,
                 "-" if c.ok is None else ("met" if c.ok else "MISSED")]
                for c in checks
            ]  # fmt: skip
            print(table(rows), file=out)
    if args.plots is not None:
        from . import _plots  # noqa: PLC0415 - matplotlib only when plots are asked for

        if twin_result is None:
            written = _plots.documented(results, args.plots)
        else:
            pair = (next(iter(results.values())), twin_result)
            written = _plots.plots(list(results.values()), pair, args.plots)
        for path in written:
            print(f"wrote {path}", file=err)
    return 0 if all(c.ok is not False for c in checks) else 1


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="ratewarden simulate")
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))

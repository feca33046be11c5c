"""Two-tier counting: each process admits from a local estimate, and syncs.

Logic only, no I/O: `_atwotier_io` and `_twotier_io` run it around the Redis
calls, async and sync.

Each process keeps, per key, the state Redis last returned (the exact global
count as it stood then), the hits it admitted on its own since (its delta), and
two rates: its own, and the other processes' (what the global count grew by
between two syncs, less its own part). A check is answered here when:

- the known state plus this process's own delta already denies it: the others'
  hits only add, so Redis would deny it too (a fixed window that is full stays
  denied until its end, without a round trip);
- it fits in this process's *allowance*: its share, by rate, of the room left
  once a margin is kept back, the margin being the part of the limit
  (``1 - exact_above``) where every check goes to Redis, plus what the others are
  estimated to have admitted since the last sync and will admit until the next.

Otherwise the check goes to Redis, exactly (`_sync.lua`: the delta added, then the
check tried). A key seen for the first time, or not synced for a while, goes to
Redis too, so a process never guesses a state it has not seen.

Over-admission therefore needs the others' rate to be misjudged: a process that
bursts far beyond its recent rate within one sync interval, while another still
holds an allowance sized by the old rates. A process that has not yet measured
its rates takes an eighth of its share.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...algorithms import Algorithm, State
from ...primitives import ConfigurationError, Decision, Rate
from ..base import BindOptions
from ..failure import Share
from .scripts import EXACT, STEP_IDS, pack, redis_params

__all__ = ["EXACT_CHECK", "Entry", "LocalLimit", "TwoTierSettings", "two_tier_settings"]

INF = math.inf
SUPPORTED = ("fixed_window", "sliding_window_counter", "bucket")
COLD_SHARE = 0.125  # a process's share of the room before it has measured the rates
# A state older than this many sync intervals, and than STALE_AT_LEAST seconds, is
# asked for again: a reset, or a Redis restart, is seen within that.
STALE_SYNCS = 20
STALE_AT_LEAST = 1.0
EXACT_CHECK = None  # `LocalLimit.decide`'s answer when Redis must decide
_ENTRY = struct.Struct(">6d")
_STATE = {2: struct.Struct(">2d"), 3: struct.Struct(">3d")}


@dataclass(frozen=True, slots=True)
class TwoTierSettings:
    """How a Redis store counts the limits bound with ``two_tier=True``.

    ``sync_interval``: seconds between syncs of every key's local hits (one
    pipelined script call per 512 keys). ``exact_above``: the fraction of a limit's
    size past which checks go to Redis one by one. ``flush_at``: a key whose
    unsynced hits reach this fraction of its size is synced at once. ``max_keys``:
    local entries kept; the least recently synced are dropped past it (their hits
    synced first)."""

    sync_interval: float = 0.05
    exact_above: float = 0.9
    flush_at: float = 0.002
    max_keys: int = 1_000_000

    def __post_init__(self) -> None:
        if type(self.sync_interval) not in (int, float) or not 0 < self.sync_interval <= 60:
            raise ConfigurationError(
                f"sync_interval must be seconds in (0, 60], got {self.sync_interval!r}"
            )
        for name in ("exact_above", "flush_at"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not 0 < value <= 1:
                raise ConfigurationError(f"{name} must be a fraction in (0, 1], got {value!r}")
        if type(self.max_keys) is not int or self.max_keys < 1:
            raise ConfigurationError(f"max_keys must be a positive integer, got {self.max_keys!r}")


def two_tier_settings(two_tier: object) -> TwoTierSettings:
    """A Redis store's ``two_tier`` argument: its settings, or the defaults."""
    if two_tier is None:
        return TwoTierSettings()
    if not isinstance(two_tier, TwoTierSettings):
        raise ConfigurationError(
            f"two_tier takes TwoTierSettings(...), got {two_tier!r}; a limit counts in two"
            " tiers when it is bound with two_tier=True (Limiter(..., two_tier=True))"
        )
    return two_tier


class Entry:
    """One key of one limit, as this process knows it."""

    __slots__ = (
        "allowance", "asking", "delta", "dwin", "grew", "key", "lease_until", "leased", "left",
        "others",
        "own", "pdelta", "pending", "rate_at", "reset_at", "samples", "sdelta", "sdwin", "seen",
        "sent",
        "spdelta", "state", "synced", "synced_us", "syncs", "taken", "until",
    )  # fmt: skip

    def __init__(self, key: str) -> None:
        self.key = key  # the Redis key
        self.state: State | None = None  # as Redis returned it at `synced`
        self.synced = -1  # server tick of that state; -1: never seen
        self.syncs = 0  # replies applied
        self.synced_us = -1  # the server's time of the state, and the send it answered:
        self.taken = 0  # a reply older than the state held is not applied
        self.sent = 0  # syncs of this entry sent, numbering them
        self.asking = 0  # the costs of exact checks under way, which may count
        self.samples = 0  # rate measurements taken
        self.delta = 0  # admitted here and not yet sent, in window `dwin`
        self.dwin = 0
        self.pdelta = 0  # admitted here in the window before `dwin` (sliding counter)
        self.sdelta = self.spdelta = self.sdwin = 0  # sent, reply not yet applied
        # calls whose reply was lost with hits of the entry, to be sent again as they
        # were (`Engine.lost`): until they are answered, the entry's new hits wait
        self.pending = 0
        self.allowance = 0  # units the fast path may admit until `until`
        self.until = 0
        self.leased = 0  # units Redis counted for this process to hand out, until:
        self.lease_until = 0
        self.left = 0  # estimated room, for Decisions
        self.reset_at = 0
        self.own = 0.0  # this process's units per tick
        self.others = 0.0  # the other processes' units per tick
        self.seen = 0  # units admitted here since `rate_at`
        self.grew = 0  # units the others added since `rate_at`
        self.rate_at = -1

    def __repr__(self) -> str:
        return (
            f"<Entry {self.key!r} state={self.state} delta={self.delta} allowance={self.allowance}>"
        )


# What one sync of an entry carried: delta, pdelta, their window, an exact check's
# cost, the lease asked with it, its number among the entry's syncs.
Sent = tuple[int, int, int, int, int, int]


class LocalLimit:
    """One limit bound with ``two_tier=True``: its entries and the decisions."""

    def __init__(
        self, algorithm: Algorithm, rate: Rate, options: BindOptions, settings: TwoTierSettings
    ) -> None:
        name = algorithm.step.__name__
        if name not in SUPPORTED:
            raise ConfigurationError(
                "two_tier counts fixed_window, sliding_window_counter, token_bucket,"
                f" leaky_bucket and gcra (continuous refill), not {algorithm.name!r}"
                + (" with refill='interval'" if name == "token_bucket_interval" else "")
            )
        params, tick_us = redis_params(rate, options["burst"], options["rule"])
        self.params, self.tick_us, self.step = params, tick_us, algorithm.step
        self.step_id = STEP_IDS[name]
        self.windowed = name != "bucket"
        self.counter = name == "sliding_window_counter"
        self.packed = pack(params, tick_us)
        self.size = params.burst if algorithm.uses_burst else params.limit
        self.prefix, self.rule = options["prefix"], options["rule"]
        self.policy = options["on_failure"]
        self.settings = settings
        self.interval = max(round(settings.sync_interval * 1e6 / tick_us), 1)  # ticks
        self.stale = max(self.interval * STALE_SYNCS, round(STALE_AT_LEAST * 1e6 / tick_us))
        self.keep = (1 - settings.exact_above) * self.size
        self.flush_at = max(int(settings.flush_at * self.size), 1)
        # what a process admits of a key it has no state of, between two syncs
        self.cold = int(self.keep * COLD_SHARE)
        self.timed = False  # the clocks' offset is known (the engine sets it)
        self.entries: dict[str, Entry] = {}
        self.hit: Any = None  # the store's bound hit, for a hit_many of this one tier
        self.local: Share | None = None  # what local_fallback counts on, if it is the policy

    def __repr__(self) -> str:
        return f"<LocalLimit {self.prefix!r}, {len(self.entries)} keys>"

    # -- the checks ---------------------------------------------------------------

    def window(self, now: int) -> int:
        """The tick at which the window holding ``now`` ends (0 for buckets)."""
        if not self.windowed:
            return 0
        period = self.params.period
        return now - now % period + period

    def current(self, entry: Entry, now: int) -> State | None:
        """The entry's state with this process's hits counted, sent or not, at ``now``."""
        state = entry.state
        if entry.sdelta or entry.spdelta:
            state = force(self, state, now, entry.sdelta, entry.sdwin, pdelta=entry.spdelta)
        if entry.delta or entry.pdelta:
            state = force(self, state, now, entry.delta, entry.dwin, pdelta=entry.pdelta)
        return state

    def room(self, state: State | None, now: int) -> int:
        """Units that fit in ``state`` at ``now``."""
        decision = self.step(state, now, 1, self.params)[0]
        return decision.remaining + 1 if decision.allowed else 0

    def decide(self, entry: Entry, now: int, cost: int) -> Decision | None:
        """The answer to a check of ``cost`` at ``now`` (server ticks) if this process
        can give it, counted if allowed; `EXACT_CHECK` if Redis must decide."""
        if entry.allowance >= cost and now < entry.until:
            return self.admit(entry, now, cost)
        if entry.leased >= cost and now < entry.lease_until:
            entry.leased -= cost
            entry.seen += cost
            entry.left -= cost
            return Decision(
                True, self.size, max(entry.left, 0), max(entry.reset_at - now, 0) / self.params.hz,
                0.0, self.rule,
            )  # fmt: skip
        # Past here Redis may be asked, the lock let go meanwhile: another thread
        # must not spend an allowance the answer may show spent.
        entry.allowance = 0
        if entry.synced < 0:
            # Unknown here: a few hits pass on no knowledge, at most `cold` a sync
            # (the next sync, which they call for, brings the state); then Redis.
            # Not before the clocks' offset is known: a window placed by a clock
            # that is off would count them where Redis drops them.
            kept = self.entries.get(entry.key[len(self.prefix) :]) is entry
            if entry.delta + cost > self.cold or not kept or not self.timed:
                return EXACT_CHECK
            decision = self.step(self.current(entry, now), now, cost, self.params)[0]
            if decision.allowed:
                self.count(entry, now, cost)
            return decision
        if now - entry.synced > self.stale:
            return EXACT_CHECK  # a state this old may be reset, or lost by a restart
        state = self.current(entry, now)
        lower = self.step(state, now, cost, self.params)[0]
        if not lower.allowed:  # the others only add: Redis would deny it too
            return lower
        self.schedule(entry, state, now, lower)
        if entry.allowance < cost:
            entry.allowance = 0
            return EXACT_CHECK
        return self.admit(entry, now, cost)

    def admit(self, entry: Entry, now: int, cost: int) -> Decision:
        """Counts ``cost`` here (`fast` does the same, inlined)."""
        entry.allowance -= cost
        entry.left -= cost
        self.count(entry, now, cost)
        return Decision(
            True, self.size, max(entry.left, 0), max(entry.reset_at - now, 0) / self.params.hz,
            0.0, self.rule,
        )  # fmt: skip

    def fast(self) -> Callable[[Entry, int, int], Decision | None]:
        """``decide``'s common case as one function: within the allowance, before
        ``until`` (which `schedule` keeps inside the delta's window), nothing but
        arithmetic and the Decision. None when `decide` must be asked."""
        size, rule, hz = self.size, self.rule, self.params.hz

        def fast(entry: Entry, now: int, cost: int) -> Decision | None:
            if entry.allowance < cost or now >= entry.until:
                if entry.leased < cost or now >= entry.lease_until:
                    return None
                entry.leased -= cost  # counted in Redis already
            else:
                entry.allowance -= cost
                entry.delta += cost
            left = entry.left = entry.left - cost
            entry.seen += cost
            reset = entry.reset_at - now
            return Decision(True, size, left, reset / hz if reset > 0 else 0.0, 0.0, rule)

        return fast

    def schedule(self, entry: Entry, state: State | None, now: int, seen: Decision) -> None:
        """Sizes the entry's allowance from ``state`` (its own hits counted)."""
        others = entry.others
        room = self.room(state, now) - entry.asking
        margin = self.keep + others * (now - entry.synced + 2 * self.interval)
        total = entry.own + others
        # Between two states a process admits at most flush_at on its own (the
        # others' rates may be stale: they were idle, and burst now), and until it
        # has measured the rates, an eighth of its share and at most `cold`: this
        # bounds what processes starting together on a key can cost.
        if entry.samples < 2 or total <= 0:
            share, most = COLD_SHARE, self.cold
        else:
            share, most = entry.own / total, self.flush_at
        # (what it has admitted since the state it holds: unsent, and sent but
        # not yet answered)
        since = entry.delta + entry.sdelta
        entry.allowance = max(min(int((room - margin) * share), most - since), 0)
        entry.left = room
        entry.reset_at = now + round(seen.reset_after * self.params.hz)
        until = now + self.interval
        if self.windowed:
            until = min(until, self.window(now))
            self.count(entry, now, 0)  # the delta in now's window: the fast path's
        entry.until = until

    def count(self, entry: Entry, now: int, cost: int) -> None:
        """Adds an admitted ``cost`` (a refund: negative) to the entry's unsent
        delta, in the window of ``now``."""
        entry.seen += cost
        if self.windowed:
            end = self.window(now)
            if end != entry.dwin:
                # the delta of the window before stays for the sliding counter's
                # weight; anything older no estimate reads any more
                keep = self.counter and end - self.params.period == entry.dwin
                entry.pdelta = entry.delta if keep else 0
                entry.delta, entry.dwin = 0, end
        entry.delta += cost

    def due(self, entry: Entry) -> bool:
        """Whether the entry's unsent hits call for a sync before the next interval."""
        return entry.delta >= self.flush_at

    # -- syncing --------------------------------------------------------------------

    def lease(self, entry: Entry, cost: int) -> int:
        """Units to ask beyond an exact check's ``cost``, counted in Redis for this
        process to hand out without asking again: about an eighth of a sync
        interval of its own traffic, and at most a quarter of the room it
        reckons is left. Unused at the window's end, they go unused: the limit
        can come out short by what the processes hold, never over."""
        lease = min(int(entry.own * self.interval / 8), entry.left // 4)
        return lease if lease >= cost else 0

    def send(self, entry: Entry, cost: int, lease: int = 0) -> tuple[bytes, Sent]:
        """`_sync.lua`'s 14 doubles for the entry with its unsent hits handed over,
        an exact check of ``cost`` (0: none) and a ``lease``; and what was sent, for
        `applied` (or `lost`, should the call fail). An entry `pending` hands over
        nothing: its new hits wait until the calls it is pending in are answered."""
        entry.sent += 1
        entry.asking += cost
        if entry.pending:
            sent = (0, 0, entry.dwin, cost, lease, entry.sent)
        else:
            sent = (entry.delta, entry.pdelta, entry.dwin, cost, lease, entry.sent)
            entry.sdelta += entry.delta
            entry.spdelta += entry.pdelta
            entry.sdwin = entry.dwin
            entry.delta = entry.pdelta = 0
        return self.payload(sent), sent

    def payload(self, sent: Sent) -> bytes:
        """What `_sync.lua` reads of one entry's part of a call."""
        delta, pdelta, dwin, cost, lease, _ = sent
        # a cost past 2^53 is denied all the same, and would not pack as a double
        return _ENTRY.pack(self.step_id, delta, dwin, pdelta, min(cost, EXACT), lease) + self.packed

    def lost(self, entry: Entry, sent: Sent) -> Sent | None:
        """A call's reply is lost: it may have been applied (a timeout after Redis ran
        it) or not. Its check is answered by the failure policy, so its cost is no
        longer under way; its hits stay sent, to go again exactly as they were
        under the same call id, which `_sync.lua` counts once. What to send again
        (no check, no lease), or None when the call carried no hits of the entry."""
        delta, pdelta, dwin, cost, _, number = sent
        entry.asking -= cost
        if not delta and not pdelta:
            return None
        entry.pending += 1
        return (delta, pdelta, dwin, 0, 0, number)

    def applied(
        self, entry: Entry, sent: Sent, reply: list[Any], server_us: int
    ) -> Decision | None:
        """Takes in a sync's reply for the entry (its six values): the new state, the
        rates, a lease, the next allowance; and the exact check's Decision, if one
        was asked."""
        delta, pdelta, dwin, cost, _, number = sent
        entry.asking -= cost
        entry.sdelta -= delta
        entry.spdelta -= pdelta
        now = server_us // self.tick_us
        allowed, remaining, reset, retry, raw, granted = reply
        state = decode(raw)
        # Replies of one entry can come back out of order (threads, connections): a
        # state older than the one held would forget hits and admit them again.
        newer = (server_us, number) > (entry.synced_us, entry.taken)
        if entry.synced >= 0 and newer:
            # what Redis would hold had nobody else counted: the room it lost beyond
            # that is the others' doing
            expected = force(self, entry.state, now, delta, dwin, pdelta=pdelta)
            if allowed == 1:
                expected = self.step(expected, now, cost + granted, self.params)[1]
            entry.grew += max(self.room(expected, now) - self.room(state, now), 0)
        if allowed == 1:
            entry.seen += cost
            if granted:
                entry.leased += granted
                remaining += granted  # the caller's room: the lease is still to hand out
                entry.lease_until = self.window(now) if self.windowed else now + self.stale
        if newer:
            entry.state, entry.synced = state, now
            entry.synced_us, entry.taken = server_us, number
            entry.syncs += 1
        if entry.rate_at < 0:
            entry.rate_at, entry.seen, entry.grew = now, 0, 0
        elif now - entry.rate_at >= self.interval // 2 + 1:
            # Nothing admitted anywhere (a full window, or no traffic) says nothing
            # of the rates: they keep what the last busy interval said, so that the
            # next window does not open with every process taking the whole room.
            if entry.seen or entry.grew:
                elapsed = now - entry.rate_at
                own, others = entry.seen / elapsed, entry.grew / elapsed
                if entry.samples:
                    own, others = (entry.own + own) / 2, (entry.others + others) / 2
                entry.own, entry.others = own, others
                entry.samples += 1
            entry.rate_at, entry.seen, entry.grew = now, 0, 0
        answer = None
        if allowed >= 0:
            hz = self.params.hz
            answer = Decision(
                allowed == 1, self.size, max(remaining, 0), reset / hz,
                INF if retry < 0 else retry / hz, self.rule,
            )  # fmt: skip
        current = self.current(entry, now)
        self.schedule(entry, current, now, answer or self.step(current, now, 1, self.params)[0])
        return answer


def decode(raw: bytes | str) -> State | None:
    """A state as `_sync.lua` returns it (packed doubles; empty: none)."""
    if not raw:
        return None
    data = raw.encode() if isinstance(raw, str) else raw
    unpacker = _STATE.get(len(data) // 8)
    if unpacker is None:
        raise ValueError(f"unexpected two-tier state of {len(data)} bytes")
    return tuple(int(x) for x in unpacker.unpack(data))


def force(
    limit: LocalLimit, state: State | None, now: int, delta: int, dwin: int, *, pdelta: int
) -> State | None:
    """``state`` with ``delta`` counted whatever the limit says, as `_sync.lua`'s
    FORCE does (the parity suite holds the two together)."""
    p = limit.params
    if limit.step_id == 1:  # fixed window: (window_end, used)
        if state is not None and now < state[0]:
            end, used = state
        else:
            end, used = now - now % p.period + p.period, 0
        if dwin >= end:
            used = max(used + delta, 0)
        return (end, used) if used else state
    if limit.counter:  # sliding window counter: (full_at, prev, curr)
        period = p.period
        if state is None:
            end, prev, curr = now - now % period + period, 0, 0
        else:
            full_at, prev, curr = state
            end = full_at - period if curr else full_at
            if now >= end:
                prev = curr if now < end + period else 0
                curr = 0
                end = now - now % period + period
        if dwin >= end:
            curr = max(curr + delta, 0)
            if pdelta:
                prev = max(prev + pdelta, 0)
        elif dwin == end - period:
            prev = max(prev + delta, 0)
        if curr:
            return (end + period, prev, curr)
        return (end, prev, 0) if prev else None
    debt = 0 if state is None or state[0] <= now else (state[0] - now) * p.scale - state[1]
    debt = max(debt + delta * p.unit, 0)
    if not debt:
        return None
    wait = -(-debt // p.scale)
    return (now + wait, wait * p.scale - debt)

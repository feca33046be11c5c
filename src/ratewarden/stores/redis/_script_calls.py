"""A check as the Redis scripts take it: everything but the I/O, shared by the
sync and async stores (one limit's arguments and answers; a multi-tier check's
script calls, written once as a generator that both stores drive)."""

from __future__ import annotations

import contextlib
import math
import struct
import time
from collections.abc import Generator, Sequence
from typing import Any, TypeAlias

from ...algorithms import Algorithm
from ...algorithms.calendar import Calendar
from ...primitives import Clock, ConfigurationError, Decision, Rate, StoreError, StoreUnavailable
from ..base import BindOptions, Check, check_cost, pick
from ..failure import Breaker, Share, answer
from .scripts import EXACT, MANY, REFUND, STEP_IDS, pack, redis_params, script_args

__all__ = [
    "SKEW_NS", "Answers", "CalendarLimit", "Call", "ClockSkew", "Limit", "Many", "script_calls",
]  # fmt: skip

INF = math.inf
_DOUBLE = struct.Struct(">d")
_BATCH_HEAD = struct.Struct(">dddd")  # _batch.lua's per check: step, peek, cost, now
_ONE = _DOUBLE.pack(1)  # _many.lua's tier at cost 1
# How far this machine's clock may be from the Redis server's for a calendar limit
# (calendar_window.lua's SKEW_US): the periods the client sends cover this much
# either side of its own time.
SKEW_NS = 300 * 1_000_000_000


class Limit:
    """One limit bound to Redis: everything about a check except the I/O, shared by
    the sync and async stores."""

    calendar: Calendar | None = None  # a CalendarLimit's: its constants move with time

    def __init__(
        self,
        algorithm: Algorithm,
        rate: Rate,
        options: BindOptions,
        breaker: Breaker,
        test_clock: Clock | None,
    ) -> None:
        params, tick_us = redis_params(rate, options["burst"], options["rule"])
        self.script = algorithm.step.__name__
        self.step_id = STEP_IDS[self.script]
        self.packed, self.tick_us = pack(params, tick_us), tick_us
        self.head = struct.pack(">d", self.step_id)
        self.tier_one = self.head + _DOUBLE.pack(1) + self.packed  # _many.lua's tier, cost 1
        self.hz, self.rule = params.hz, params.rule
        self.size = params.burst if algorithm.uses_burst else params.limit
        self.prefix, self.policy = options["prefix"], options["on_failure"]
        self.breaker, self.test_clock = breaker, test_clock
        self.hit: Any = None  # the store's bound hit, for a hit_many of this one tier
        self.local: Share | None = None  # what local_fallback counts on, if it is the policy

    def refresh(self) -> None:
        """A plain limit's constants never move (see `CalendarLimit.refresh`)."""

    def blocked(self, key: str, cost: int, mode: str) -> Decision | None:
        """The policy's answer for one check while the breaker is open, else None."""
        return _blocked([self], [(key, cost)], peek=mode == "peek")

    def request(self, key: str, cost: int, mode: str) -> list[Any] | Decision:
        """The script's arguments, or the policy's answer while the breaker is open."""
        check_cost(cost)
        if self.breaker.failures and (blocked := self.blocked(key, cost, mode)) is not None:
            return blocked
        clock = self.test_clock
        now_us = None if clock is None else clock.time_ns() // 1000
        return script_args(self.prefix + key, self.packed, now_us, cost, mode)

    def batched(self, key: str, cost: int, mode: str) -> list[Any] | Decision:
        """As `request`, for _batch.lua: the key and the check's 12 doubles."""
        check_cost(cost)
        if self.breaker.failures and (blocked := self.blocked(key, cost, mode)) is not None:
            return blocked
        clock = self.test_clock
        now_us = -1 if clock is None else clock.time_ns() // 1000
        # a cost past 2^53 is denied all the same, and would not pack as a double
        cost = cost if cost < EXACT else EXACT
        head = _BATCH_HEAD.pack(self.step_id, mode == "peek", cost, now_us)
        return [self.prefix + key, head + self.packed]

    def answer(self, result: list[int]) -> Decision:
        if self.breaker.failures:
            self.breaker.succeeded()
        allowed, remaining, reset, retry = result
        hz = self.hz
        return Decision(
            allowed == 1, self.size, remaining, reset / hz, INF if retry < 0 else retry / hz,
            self.rule,
        )  # fmt: skip

    def failed(self, error: StoreError, key: str, cost: int, mode: str = "hit") -> Decision:
        return _failed([self], error, [(key, cost)], peek=mode == "peek")


class ClockSkew(StoreError):
    """A calendar limit's check that Redis refused: this machine's clock and the
    server's are further apart than `SKEW_NS`. The limit's ``on_failure`` answers."""


class CalendarLimit(Limit):
    """A limit on a time zone's calendar periods (see calendar_window.lua): the
    zone's rules run here, on this machine's clock, which picks two periods; the
    script picks the one holding the server's time. ``client_clock``: the clock
    the periods are picked on (tests set it apart from the server's)."""

    def __init__(
        self,
        algorithm: Algorithm,
        rate: Rate,
        options: BindOptions,
        breaker: Breaker,
        test_clock: Clock | None,
    ) -> None:
        super().__init__(algorithm, rate, options, breaker, test_clock)
        self.calendar = options["calendar"]
        self.client_clock = test_clock
        # the first period sent, [start, end) in ns, and the constants but the
        # client's time: one tuple, so that threads never see one without the other
        self._periods = (0, 0, b"")
        self.refresh()

    def refresh(self) -> None:
        """The constants for a check now: the limit's, the two periods, the time
        (the periods are worked out again only once the first has passed). Threads
        that interleave here leave the constants of one of their times, which are
        microseconds apart and all within the periods sent."""
        clock = self.client_clock
        now_ns = time.time_ns() if clock is None else clock.time_ns()
        low = now_ns - SKEW_NS
        start, end, lead = self._periods
        if not start <= low < end:
            assert self.calendar is not None
            start, end = self.calendar.window(low)
            after = self.calendar.window(end)[1]
            tick_ns = self.tick_us * 1000  # edges are whole seconds: whole ticks
            # burst is the limit: _many.lua and _batch.lua size step 6 by it
            _, limit, period = struct.unpack(">3d", self.packed[:24])
            lead = struct.pack(
                ">7d", self.tick_us, limit, period, limit,
                start // tick_ns, end // tick_ns, after // tick_ns,
            )  # fmt: skip
            self._periods = (start, end, lead)
        packed = lead + _DOUBLE.pack(now_ns // 1000)
        self.packed, self.tier_one = packed, self.head + _ONE + packed

    def request(self, key: str, cost: int, mode: str) -> list[Any] | Decision:
        self.refresh()
        return super().request(key, cost, mode)

    def batched(self, key: str, cost: int, mode: str) -> list[Any] | Decision:
        self.refresh()
        return super().batched(key, cost, mode)

    def answer(self, result: list[int]) -> Decision:
        if result[1] < 0:  # refused: the clocks too far apart (see calendar_window.lua)
            server = result[2] * self.tick_us / 1e6
            mine = struct.unpack(">d", self.packed[-8:])[0] / 1e6
            raise ClockSkew(
                f"redis: a calendar limit's periods come from this machine's clock,"
                f" {mine - server:+.0f}s from the Redis server's (at most"
                f" {SKEW_NS // 1_000_000_000}s apart): set both clocks right (NTP)"
            )
        return super().answer(result)


def _blocked(
    limits: Sequence[Limit], checks: Sequence[tuple[str, int]], *, peek: bool = False
) -> Decision | None:
    """The policies' answer while the (shared) breaker is open, else None."""
    breaker = limits[0].breaker
    if breaker.allow():
        return None
    wait = breaker.retry_after()
    error = StoreUnavailable(f"redis: circuit open, next probe in {wait:.3f}s")
    return answer(limits, checks, wait, error, peek=peek)


def _failed(
    limits: Sequence[Limit],
    error: StoreError,
    checks: Sequence[tuple[str, int]],
    *,
    peek: bool = False,
) -> Decision:
    """The policies' answer when the store failed: ``"raise"`` in any tier raises."""
    breaker = limits[0].breaker
    if type(error) is not ClockSkew:  # a skewed clock is this machine's, not the store's
        breaker.failed()
    return answer(limits, checks, breaker.retry_after(), error, peek=peek)


class Many:
    """A multi-tier check as _many.lua takes it: no I/O, shared by the twins."""

    def __init__(self, checks: Sequence[Check], shadow: Sequence[Check] = ()) -> None:
        if not checks and not shadow:
            raise ConfigurationError("hit_many needs at least one check")
        everything = (*checks, *shadow) if shadow else checks
        self.limits: list[Limit] = [check[0] for check in everything]
        self.keys: list[str] = []
        self.tiers: list[bytes] = []  # per tier: step number, cost, the limit's constants
        keys, tiers = self.keys, self.tiers
        for limit, key, cost in everything:
            keys.append(limit.prefix + key)
            if limit.calendar is not None:
                limit.refresh()
            if cost == 1 and type(cost) is int:  # the common cost, packed once per limit
                tiers.append(limit.tier_one)
            else:
                check_cost(cost)
                # a cost past 2^53 is denied all the same, and would not pack as a double
                tiers.append(limit.head + _DOUBLE.pack(min(cost, EXACT)) + limit.packed)
        self.enforced = len(checks)  # the tiers after these are shadow tiers
        self.checks, self.shadow = checks, shadow
        clock = self.limits[0].test_clock
        self.now = "" if clock is None else clock.time_ns() // 1000

    @property
    def raw(self) -> list[tuple[str, int]]:
        """The keys as given, and the costs (for the failure policies)."""
        return [(key, cost) for _, key, cost in (*self.checks, *self.shadow)]

    def args(self, tiers: Sequence[int] | None, mode: str) -> list[Any]:
        """_many.lua's keys then arguments, for the tiers numbered ``tiers`` (None:
        all of them, as it must be when there are shadow tiers)."""
        if tiers is None:
            args: list[Any] = [*self.keys, self.now, mode, b"".join(self.tiers)]
        else:
            args = [self.keys[i] for i in tiers]
            args += (self.now, mode, b"".join([self.tiers[i] for i in tiers]))
        if self.enforced < len(self.keys):
            args.append(self.enforced)
        return args

    def answer(self, tiers: Sequence[int], out: list[Any]) -> tuple[int, Decision]:
        """The tier _many.lua chose (see `pick`) and its Decision."""
        tier: int = tiers[out[0] - 1]
        return tier, self.limits[tier].answer(out[1:5])

    def answers(self, out: list[Any]) -> tuple[Decision | None, Decision | None]:
        """The enforced and the shadow tiers' Decisions from a call of every tier
        (None: no such tiers, or shadow tiers not checked)."""
        limits = self.limits
        decision = limits[out[0] - 1].answer(out[1:5]) if out[0] else None
        try:
            shadow = limits[out[5] - 1].answer(out[6:10]) if out[5] else None
        except ClockSkew:  # shadow tiers report nothing when they cannot be checked
            shadow = None
        return decision, shadow

    def failed(self, error: StoreError) -> tuple[Decision | None, Decision | None]:
        """The enforced tiers' policies answer; shadow tiers report nothing."""
        enforced = self.enforced
        if not enforced:  # shadow tiers report nothing
            return None, None
        return _failed(self.limits[:enforced], error, self.raw[:enforced]), None

    def blocked(self) -> tuple[Decision | None, Decision | None] | None:
        enforced = self.enforced
        if not enforced:  # shadow tiers only: nothing to answer, only whether to ask
            return None if self.limits[0].breaker.allow() else (None, None)
        decision = _blocked(self.limits[:enforced], self.raw[:enforced])
        if decision is None:
            return None
        return decision, None

    def slots(self, keyslot: Any) -> list[list[int]]:
        """The tiers grouped by cluster slot, in order of first appearance."""
        groups: dict[int, list[int]] = {}
        for i, key in enumerate(self.keys):
            groups.setdefault(keyslot(key), []).append(i)
        return list(groups.values())

    def refund_args(self, tiers: Sequence[int], written: list[Any]) -> list[Any]:
        """_refund.lua's keys and arguments from a "keep" call's written triples."""
        tick_of = {self.keys[i]: self.limits[i].tick_us for i in tiers}
        keys = written[0::3]
        args: list[Any] = [*keys, self.now]
        for key, before, wrote in zip(keys, written[1::3], written[2::3], strict=True):
            name = key.decode() if isinstance(key, bytes) else key
            args += (wrote, before, tick_of[name])
        return args


Call: TypeAlias = tuple[str, int, list[Any]]  # script name, numkeys, keys + arguments


Answers: TypeAlias = tuple[Decision | None, Decision | None]  # enforced, shadow


def script_calls(many: Many, keyslot: Any) -> Generator[Call, Any, Answers]:
    """The script calls a multi-tier check makes, written once for both twins: each
    yields a call, is sent its result, and returns the Decisions of the enforced
    and the shadow tiers (httpx's auth flows drive sync and async the same way).
    ``keyslot``: a cluster client's, to group the tiers by slot; None on one node."""
    if many.limits[0].breaker.failures:
        blocked = many.blocked()
        if blocked is not None:
            return blocked
    groups = None if keyslot is None else many.slots(keyslot)
    if groups is None or len(groups) == 1:
        out = yield MANY, len(many.keys), many.args(None, "hit")
        return many.answers(out)
    if many.shadow:  # across slots: the enforced tiers, then the shadow ones, apart
        decision = None
        if many.checks:
            decision = yield from _part(Many(many.checks), keyslot)
            if decision is not None and not decision.allowed:
                return decision, None
        return decision, (yield from _part(Many(many.shadow), keyslot))
    # Across slots: count slot by slot; after a denial only evaluate, then refund
    # the slots that counted (see RedisStore). A store error (thrown in by the
    # driver) after a slot denied still answers that denial; one before any
    # denial refunds what counted, as far as the store lets it, and goes to the
    # policy. A refund that fails leaves its count: deny more, never admit more.
    decisions: list[tuple[int, Decision]] = []
    counted: list[tuple[list[int], list[Any]]] = []
    denied = False
    failure: StoreError | None = None
    for tiers in groups:
        try:
            out = yield MANY, len(tiers), many.args(tiers, "dry" if denied else "keep")
            answered = many.answer(tiers, out)  # ClockSkew: a refusal that counted nothing
        except StoreError as exc:
            if not denied:
                failure = exc
            break
        decisions.append(answered)
        if not decisions[-1][1].allowed:
            denied = True
        elif not denied:
            counted.append((tiers, out[10:]))
    if denied or failure is not None:
        for tiers, written in counted:
            if written:
                with contextlib.suppress(StoreError):
                    yield REFUND, len(written) // 3, many.refund_args(tiers, written)
    if failure is not None:
        raise failure
    decisions.sort(key=lambda tier_decision: tier_decision[0])  # ties go by tier order
    return pick([decision for _, decision in decisions]), None


def _part(many: Many, keyslot: Any) -> Generator[Call, Any, Decision | None]:
    """One side of a check split across slots, its own policies answering for it."""
    try:
        return (yield from script_calls(many, keyslot))[0]
    except StoreError as exc:
        return many.failed(exc)[0]

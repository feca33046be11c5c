"""`Outcome`: what the rule engine says about one request, and the response
headers it makes for the front end.

How an engine holds a request its rules delay or queue (`holding`): written once,
a flow (`ratewarden._flow`) that the blocking and the asyncio engine drive.

The actions that shape traffic instead of refusing it, for the rule engine:
``queue`` (a paced line) and ``degrade`` (pass, but serve less). No I/O here:
`shaped` yields the store calls to the engine's sync or async shell, so the
logic is written once.

A request whose rules are all ``reject``/``delay``/``shadow_ban``/``log_only``
on plain limits never comes here (the engine's one ``hit_tiers`` call of the
store). An adaptive or sharded limit among them comes here for `hit_tiers` of
the limiters, which prices and drives them: then step 2 alone. With queue or
degrade rules it takes these steps, each a store call:

1. **peek** every queue tier: a full queue turns the request away before anything
   counts (429, Retry-After: when the line has room for it);
2. **the other tiers**, as always: the enforced ones all or nothing, then the
   ``log_only`` ones; a denial ends it;
3. **the queue tiers**, all or nothing: each hands out the next slot of its
   schedule (a leaky bucket whose depth is the line), and the request learns
   when it is due. Another process may have taken the last place between the
   peek and this step: the request is then turned away although step 2 counted
   it (the one case where a refused request counts; it needs two processes
   racing for the last place of a full queue);
4. **the degrade tiers**, all or nothing: a tier over its limit does not deny,
   it sets the level (``Outcome.degrade``): 1 when over, or, with ``full_at``,
   the share of the way from the limit to ``full_at`` times it.

Queue and degrade tiers are left out of the rate-limit headers: a queued
request is not refused, and a degraded one learns its level from its own header.

What ``log_only`` does (`ShadowLog`): a line on the ``ratewarden.rules`` logger
at WARNING for each rule and key whose limit would have denied, itself limited
so that a flood of keys cannot flood the log or grow memory.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Literal, TypeAlias

import msgspec

from ..kernel import AsyncTurns, Turns, policy_item, rate_limit_fields
from ..primitives import Call, Clock, ConfigurationError, Decision, Flow, Rate, adrive
from ..stores import pick
from ._compile import Applicable, CompiledRule, RuleSet, ceiling_start
from ._schema import Response
from ._settle import Settles

__all__ = [
    "Counted",
    "Outcome",
    "ShadowLog",
    "Verdict",
    "await_out",
    "classed",
    "degrade_level",
    "holding",
    "level_header",
    "queue_wait",
    "shaped",
    "shaped_outcome",
    "waiting_out",
]

Verdict = Literal["allow", "reject", "delay", "shadow_ban", "queue", "degrade"]
_UNSHOWN = ("log_only", "degrade")  # limits the rate-limit headers leave out
log = logging.getLogger("ratewarden.rules")


class Outcome(msgspec.Struct, frozen=True):
    """What the engine says about one request, for the front end to act on.

    ``allowed``      proceed with the request;
    ``action``       ``"allow"``, ``"reject"`` (answer ``status``), ``"delay"``
                     (hold the request ``wait`` seconds, then check again; a front
                     end that cannot wait rejects with ``status``) or
                     ``"shadow_ban"`` (answer ``response`` without processing),
                     ``"queue"`` (allowed: hold the request ``wait`` seconds, then
                     let it through; its slot is taken) or ``"degrade"``
                     (allowed: serve it, at the lower quality ``degrade`` asks);
    ``decision``     the Decision of the enforced limits (None: none applied);
    ``rule``         the rule that denied, when denied (allowed: the queue or
                     degrade rule that shaped the request, if one did);
    ``status``       the HTTP status to answer: 200 when allowed;
    ``retry_after``  seconds until this request would pass (``decision``'s);
    ``shadow``       the Decision of the ``log_only`` limits (None: none applied);
                     ``shadow.allowed`` False means they would have denied, and
                     ``shadow.rule`` names one that would have;
    ``limits``       every limit that applied;
    ``degrade``      how much to degrade the response, 0 (not at all) to 1, when a
                     ``degrade`` rule's caller is over its limit;
    ``settle``       when allowed and a rule that applied counts by response
                     (``count``) or settles its cost (``settle``): the token that
                     the engine's ``settle`` takes once the request ran (`_settle`).
    """

    allowed: bool
    action: Verdict
    decision: Decision | None
    rule: CompiledRule | None = None
    status: int = 200
    retry_after: float = 0.0
    wait: float = 0.0
    response: Response | None = None
    shadow: Decision | None = None
    limits: tuple[Applicable, ...] = ()
    degrade: float = 0.0
    settle: str | None = None

    def __bool__(self) -> bool:
        return self.allowed

    def headers(self, *, legacy: bool = True, ietf: bool = True) -> list[tuple[str, str]]:
        """The response headers for this outcome (see `ratewarden._headers`):
        X-RateLimit-* (``legacy``) and RateLimit / RateLimit-Policy (``ietf``) for
        the enforced limit closest to denying, and Retry-After when denied. An
        empty list when no enforced limit applied; ``log_only`` and ``degrade``
        limits never show. A degraded request gets its rule's degrade header, if
        the rule names one (`degrade_headers`)."""
        if self.decision is None:
            return self.degrade_headers()
        return list(self.header_fields(legacy=legacy, ietf=ietf, response=False).items())

    def header_fields(
        self, *, legacy: bool = True, ietf: bool = True, response: bool = True
    ) -> dict[str, str]:
        """`headers` by name, as the service answers them; with ``response``, a
        shadow ban's response headers in place, so that the client cannot tell
        it from a real answer."""
        decision = self.decision
        if decision is None:
            return dict(self.degrade_headers())
        policy = ""
        if ietf:  # a loop, not a generator: this runs for every answer
            names: list[str] = []
            for applicable in self.limits:
                if applicable.rule.action in _UNSHOWN:
                    continue
                spec = applicable.limit
                if spec.name in names:
                    continue
                names.append(spec.name)
                quota = spec.rate.limit if spec.burst is None else spec.burst
                item = policy_item(spec.name, quota, spec.rate.period)
                policy = item if not policy else f"{policy}, {item}"
        fields = rate_limit_fields(decision, policy, legacy=legacy, ietf=ietf)
        if self.degrade:
            fields.update(self.degrade_headers())
        if response and self.action == "shadow_ban" and self.response is not None:
            fields.update(self.response.headers)
        return fields

    def degrade_headers(self) -> list[tuple[str, str]]:
        """The degrade rule's own header (``X-RateLimit-Degraded: 1``, or the
        level) when the request is degraded and the rule asks for one."""
        if not self.degrade or self.rule is None:
            return []
        header = level_header(self.rule, self.degrade)
        return [] if header is None else [header]


def holding(
    lines: Turns | AsyncTurns,
    outcome: Outcome,
    attributes: Mapping[str, object],
    check_again: Call,
    sleep: Callable[[float], Any],
) -> Flow[Outcome]:
    """How an engine holds a ``delay`` or ``queue`` outcome, written once for both:
    a delay in priority classes in its place among ``lines`` (the engine's), any
    other as `waiting_out` does. The engine's shell hands it ``check_again`` and
    ``sleep`` of its kind (blocking or awaited) and drives it."""
    if classed(outcome):
        return (yield from _in_line(lines, outcome, attributes, check_again, sleep))
    return (yield from waiting_out(outcome, check_again, lines.clock, sleep))


def waiting_out(
    outcome: Outcome, check_again: Call, clock: Clock, sleep: Callable[[float], Any]
) -> Flow[Outcome]:
    """A queued request sleeps until its slot (it is counted: no second check). A
    delayed one sleeps its wait and checks again, until it passes, is rejected,
    or would wait past the rule's ``max_wait`` counted from now. Any other
    outcome is returned as it is."""
    if outcome.action == "queue":  # its slot is taken: hold it until due, then go
        yield partial(sleep, outcome.wait)
        return _released(outcome)
    if outcome.action != "delay" or outcome.rule is None:
        return outcome
    deadline = clock.time_ns() + round((outcome.rule.max_wait or 0) * 1e9)
    while True:
        if clock.time_ns() + round(outcome.wait * 1e9) > deadline:
            return _rejected(outcome)
        yield partial(sleep, outcome.wait)
        outcome = yield check_again
        if outcome.action != "delay":
            return outcome


async def await_out(
    outcome: Outcome, check_again: Callable[[], Awaitable[Outcome]], clock: Clock
) -> Outcome:
    """`waiting_out` without blocking the event loop, for a caller that checks on its
    own (the ASGI middleware with a sync engine)."""
    return await adrive(waiting_out(outcome, check_again, clock, clock.asleep))


def _released(outcome: Outcome) -> Outcome:
    """A queued request whose slot has come: it goes (degraded, if it was)."""
    action: Verdict = "degrade" if outcome.degrade else "allow"
    return msgspec.structs.replace(outcome, action=action, wait=0.0)


Tier: TypeAlias = "tuple[Any, str, int]"  # (limiter, key, cost), sync or async
# decision of the enforced tiers, of the shadow ones, of the queue, of degrade, the
# queue's tiers, the token of the settled hits
Counted: TypeAlias = "tuple[Decision | None, Decision | None, Decision | None, Decision | None, list[Tier], str | None]"  # noqa: E501


def shaped(
    ruleset: RuleSet,
    enforced: list[Tier],
    shadow: list[Tier],
    tiers: Callable[[list[Tier], list[Tier]], Any],
    many: Callable[[list[Tier]], Any],
    *,
    settles: Settles | None = None,
    cost: int = 1,
) -> Flow[Counted]:
    """The store calls of a request with queue or degrade tiers, or adaptive or
    sharded ones, or tiers of rules that settle (see the module docstring),
    yielded; the Decisions they gave. ``tiers`` and ``many`` are `hit_tiers` and
    `hit_many` of the engine's kind, and the limiters' own ``peek`` looks at a
    queue; ``settles`` reserves the tiers of rules that settle (`_settle`), first,
    and gives them back if the request is refused after all (``cost``: the
    request's). A Decision of the queue that denies means the request is turned
    away; the enforced one denying, too."""
    by_limit = ruleset.by_limit_name
    plain: list[Tier] = []
    queue: list[Tier] = []
    degrade: list[Tier] = []
    reserved: list[Tier] = []
    for tier in enforced:
        rule = by_limit.get(tier[0].name or "")
        action = "reject" if rule is None else rule.action
        if rule is not None and rule.settles and settles is not None:
            reserved.append(tier)
            continue
        (queue if action == "queue" else degrade if action == "degrade" else plain).append(tier)
    for limiter, key, charged in queue:
        full: Decision = yield partial(limiter.peek, key, charged)
        if not full.allowed:
            return None, None, full, None, queue, None
    held: Decision | None = None
    taken: list[Any] = []
    if reserved and settles is not None:
        held, taken = yield from settles.taking(reserved, cost)
        if not held.allowed:
            return held, None, None, None, queue, None
    decision = report = None
    if plain or shadow:
        decision, report = yield partial(tiers, plain, shadow)
        if decision is not None and not decision.allowed:
            if settles is not None:
                yield from settles.giving_back(taken)
            return decision, report, None, None, queue, None
    if held is not None:
        decision = held if decision is None else pick((held, decision))
    queued = (yield partial(many, queue)) if queue else None
    if queued is not None and not queued.allowed:
        if settles is not None:
            yield from settles.giving_back(taken)
        return decision, report, queued, None, queue, None
    degraded = (yield partial(many, degrade)) if degrade else None
    token = None if settles is None else settles.token(taken)
    return decision, report, queued, degraded, queue, token


def queue_wait(queued: Decision, tiers: list[Tier]) -> float:
    """Seconds until a request's slot in the queue falls due. The bucket is full
    again ``reset_after`` from now, and this request's own slot is the last
    ``cost`` emission intervals of that."""
    for limiter, _, cost in tiers:
        if limiter.name == queued.rule:
            rate: Rate = limiter.rate
            # in whole nanoseconds, as the bucket counts: 0.2, not 0.19999999999999998
            wait_ns = round(queued.reset_after * 1e9) - round(cost * rate.period_ns / rate.limit)
            return max(0, wait_ns) / 1e9
    return 0.0


def degrade_level(degraded: Decision, ruleset: RuleSet) -> tuple[float, CompiledRule | None]:
    """How much to degrade (0: not at all, up to 1) by the degrade tiers' Decision,
    and the rule that says so. The limit in force counts up to ``full_at`` times
    the rule's own limit, so that limit is read back from the ceiling the
    Decision reports: the level follows a limit changed at runtime (an override)."""
    rule = ruleset.by_limit_name.get(degraded.rule or "")
    if not degraded.allowed:
        return 1.0, rule
    if rule is None or rule.rule.degrade is None or degraded.degraded:
        return 0.0, rule
    full_at = rule.rule.degrade.full_at
    if full_at is None:  # over the plain limit is a denial
        return 0.0, rule
    ceiling = degraded.limit
    start = ceiling_start(ceiling, full_at)
    used = ceiling - degraded.remaining
    if used <= start or ceiling <= start:
        return 0.0, rule
    return min(1.0, (used - start) / (ceiling - start)), rule


def level_header(rule: CompiledRule, level: float) -> tuple[str, str] | None:
    """The rule's degrade header for ``level``: ``1`` for a rule without levels,
    else the level with two decimals (never ``0.00`` for a degraded request)."""
    name = rule.degrade_header
    if name is None:
        return None
    if rule.rule.degrade is None or rule.rule.degrade.full_at is None:
        return name, "1"
    return name, f"{max(level, 0.01):.2f}" if level < 1 else "1"


def shaped_outcome(
    outcome_of: Callable[[RuleSet, list[Applicable], Decision | None, Decision | None], Outcome],
    ruleset: RuleSet,
    applicable: list[Applicable],
    counted: Counted,
) -> Outcome:
    """The outcome of a request that met queue or degrade rules, from what
    `shaped` counted; ``outcome_of`` is the engine's for the plain tiers (a full
    queue is a denial of its rule, answered 429)."""
    decision, report, queued, degraded, queue, token = counted
    if queued is not None and not queued.allowed:
        return outcome_of(ruleset, applicable, queued, None)
    outcome = outcome_of(ruleset, applicable, queued if decision is None else decision, report)
    if not outcome.allowed:
        return outcome
    changes: dict[str, Any] = {} if token is None else {"settle": token}
    if degraded is not None:
        level, rule = degrade_level(degraded, ruleset)
        if level > 0:
            changes.update(action="degrade", degrade=level, rule=rule)
    if queued is not None:
        wait = queue_wait(queued, queue)
        if wait > 0:
            changes.update(action="queue", wait=wait)
            changes.setdefault("rule", ruleset.by_limit_name.get(queued.rule or ""))
    return msgspec.structs.replace(outcome, **changes) if changes else outcome


# -- delays in priority classes ---------------------------------------------------
#
# A delay rule with ``priority_from`` holds its delayed requests in a line per
# limit and key (`_waiting.Turns`), in class order: only the head checks again,
# when its wait is over, and it steps aside for a higher class that arrived in
# the meantime. Every request keeps the rule's ``max_wait``, counted from its
# first check; one that cannot make it is rejected as soon as that is known.


def _line_of(outcome: Outcome) -> str:
    """The line a delayed request waits in: the denying limit and its key."""
    decision = outcome.decision
    name = "" if decision is None else decision.rule or ""
    for applicable in outcome.limits:
        if applicable.limit.name == name:
            return f"{name}\x00{applicable.key}"
    return name


def _rejected(outcome: Outcome) -> Outcome:
    """A delay that cannot be held within the rule's ``max_wait``: rejected after all."""
    return msgspec.structs.replace(outcome, action="reject", wait=0.0, status=429)


def classed(outcome: Outcome) -> bool:
    """Whether a delayed request waits in priority classes."""
    return outcome.rule is not None and outcome.rule.priority_from is not None


def _in_line(
    turns: Turns | AsyncTurns,
    outcome: Outcome,
    attributes: Mapping[str, object],
    check_again: Call,
    sleep: Callable[[float], Any],
) -> Flow[Outcome]:
    """Hold a delayed request in its class's place in line among ``turns``."""
    rule, clock = outcome.rule, turns.clock
    if rule is None:  # not classed(): nothing to wait for here
        return outcome
    line = _line_of(outcome)
    checked = clock.time_ns()  # the outcome's wait counts from here, however long the line
    deadline = checked + round((rule.max_wait or 0) * 1e9)
    if not (yield partial(turns.wait_turn, line, deadline, rule.priority_of(attributes))):
        return _rejected(outcome)
    has_turn = True
    try:
        while outcome.action == "delay":
            due = checked + round(outcome.wait * 1e9)
            if due > deadline:
                return _rejected(outcome)
            now = clock.time_ns()
            if due > now:
                turns.expire_before(line, due)
                yield partial(sleep, (due - now) / 1e9)
            if turns.outranked(line):
                has_turn = False  # a step aside that raises has given the turn up already
                has_turn = yield partial(turns.step_aside, line, deadline)
                if not has_turn:
                    return _rejected(outcome)
            outcome = yield check_again
            checked = clock.time_ns()
        return outcome
    finally:
        if has_turn:
            turns.leave(line)


# -- log_only ---------------------------------------------------------------------


class ShadowLog:
    """Logs what ``log_only`` rules would have denied, within bounds of its own.

    One WARNING line on ``ratewarden.rules`` for a rule (its limit) and key
    that would deny, then none for that pair for ``every`` seconds; at most
    ``lines`` lines every ``every`` seconds in all. A line over that budget is
    counted instead, and the count logged once the period is over. A pair is
    remembered (by its hash: an attacker's long keys cost no memory) only for a
    line that was written, and forgotten ``every`` seconds later, so memory
    holds at most the lines of the last two periods. Time is ``clock``'s (the
    store's), so tests move it by hand.

    The line's fields (``extra={"fields": ...}``, which the service's JSON lines
    carry): ``event`` ``log_only``, ``rule``, ``limit`` (the tier's name),
    ``key``, ``cost``, ``limit_size``, ``retry_after``, ``degraded``.
    """

    def __init__(self, clock: Clock, *, every: float = 60.0, lines: int = 1000) -> None:
        if not every > 0:
            raise ConfigurationError(f"every must be > 0 seconds, got {every!r}")
        if type(lines) is not int or lines < 1:
            raise ConfigurationError(f"lines must be an integer >= 1, got {lines!r}")
        self.clock = clock
        self.every = every
        self.lines = lines
        self._every_ns = round(every * 1e9)
        self._lock = threading.Lock()  # a sync engine's checks run in many threads
        # hash((limit, key)) -> when its line was written, oldest first
        self._logged: OrderedDict[int, int] = OrderedDict()
        self._period_start: int | None = None
        self._written = 0  # lines of the current period
        self._suppressed = 0  # lines over the budget in the current period

    def __len__(self) -> int:
        """The pairs remembered now."""
        return len(self._logged)

    def would_deny(self, shadow: Decision, limits: Sequence[Applicable]) -> None:
        """``shadow`` (the log_only tiers' Decision) denied: log it, if due."""
        name = shadow.rule or ""
        applicable = next((a for a in limits if a.limit.name == name), None)
        key = "" if applicable is None else applicable.key
        pair = hash((name, key))
        now = self.clock.time_ns()
        with self._lock:
            last = self._logged.get(pair)
            if last is not None and now - last < self._every_ns:
                return
            suppressed = self._new_period(now)
            if self._written >= self.lines:
                self._suppressed += 1
                return
            self._written += 1
            self._logged[pair] = now
            self._logged.move_to_end(pair)
            horizon = now - self._every_ns
            while self._logged and next(iter(self._logged.values())) <= horizon:
                self._logged.popitem(last=False)
        if suppressed:
            log.warning(
                "log_only: %d more would-deny lines left out in the last %gs",
                suppressed, self.every,
                extra={"fields": {"event": "log_only_suppressed", "suppressed": suppressed}},
            )  # fmt: skip
        rule = None if applicable is None else applicable.rule.name
        fields = {
            "event": "log_only", "rule": rule, "limit": name, "key": key,
            "cost": None if applicable is None else applicable.cost,
            "limit_size": shadow.limit, "retry_after": shadow.retry_after,
            "degraded": shadow.degraded,
        }  # fmt: skip
        # %r: a key is the client's own text, and a newline in it must not forge a line
        log.warning(
            "log_only rule %r would deny key %r (%s)", rule, key, name, extra={"fields": fields}
        )

    def _new_period(self, now: int) -> int:
        """Start a new budget period if the last one is over; the lines the last
        one left out (to log now), else 0."""
        start = self._period_start
        if start is not None and 0 <= now - start < self._every_ns:
            return 0
        suppressed, self._suppressed = self._suppressed, 0
        self._period_start, self._written = now, 0
        return suppressed

    def __repr__(self) -> str:
        return (
            f"<ShadowLog a line per rule and key every {self.every:g}s, at most {self.lines}; "
            f"{len(self._logged)} remembered>"
        )

"""A rule ready to match (`CompiledRule`), its limits (`LimitSpec`) and what a
request gets from it (`Applicable`): the pieces a `RuleSet` indexes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec

from ..primitives import Rate, parse_rate
from ._clientip import client_ip_function, peer_ip
from ._paths import Pattern, parse_pattern
from ._schema import (
    Action,
    AdaptiveLimit,
    CalendarSpec,
    FailurePolicy,
    Refill,
    Response,
    Rule,
    RuleFile,
    as_list,
    rule_algorithm,
)
from ._schema_settle import statuses

__all__ = [
    "DEFAULT_LEASE",
    "METHODS",
    "Applicable",
    "CompiledRule",
    "Entry",
    "KeyFn",
    "LimitSpec",
    "as_text",
    "ceiling_of",
    "ceiling_start",
    "normal_method",
    "spec_for",
    "text_of",
]

DEFAULT_LEASE = 30.0  # seconds a concurrency rule's hold lasts unless released
KeyFn = Callable[[Mapping[str, object]], "str | None"]
# (group, rank, methods, attribute conditions, key function, rule, slot, cost)
Entry = tuple[
    "str | None",
    int,
    "frozenset[str] | None",
    "tuple[tuple[str, frozenset[str]], ...]",
    KeyFn,
    "CompiledRule",
    int,
    int,
]


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """One rate of one rule: what the engine builds a limiter from."""

    name: str
    rate: Rate
    algorithm: str
    burst: int | None
    refill: Refill
    on_failure: FailurePolicy
    two_tier: bool = False  # counted locally and synced (store: two_tier)
    shards: int = 1  # each key's limit split over this many cluster slots
    # action degrade with full_at: the rule's own limit, from which the level grows
    # (the limiter counts up to full_at times it)
    degrade_from: int | None = None
    # adaptive: the limit follows a load signal (see ratewarden._adaptive)
    adaptive: AdaptiveLimit | None = None
    calendar: CalendarSpec | None = None  # windows on a time zone's calendar

    @property
    def file_rate(self) -> Rate:
        """The rate the rule file gives, as people are shown it: a degrade rule
        with ``full_at`` counts up to a ceiling above it."""
        if self.degrade_from is None:
            return self.rate
        return Rate(self.degrade_from, self.rate.period)


def _counted_statuses(rule: Rule) -> tuple[bool, tuple[tuple[int, int], ...]] | None:
    """A ``count`` rule's statuses: whether they are the ones that count (True) or
    all but them, and their ranges; None for a rule that counts every response."""
    if rule.count is None:
        return None
    return bool(rule.count.status), statuses(rule.count.status or rule.count.not_status)


class CompiledRule:
    """A rule ready to match; ``rule`` is the `Rule` as the file said it."""

    __slots__ = (
        "action",
        "attributes",
        "by",
        "concurrency",
        "cost",
        "cost_attribute",
        "counted_statuses",
        "degrade_header",
        "group",
        "group_key",
        "index",
        "key",
        "lease",
        "limits",
        "line",
        "max_wait",
        "methods",
        "name",
        "paths",
        "priority",
        "priority_from",
        "queue",
        "rank",
        "response",
        "rule",
        "settles",
        "slots",
        "specificity",
        "status",
    )

    def __init__(self, rule: Rule, index: int, line: int | None, file: RuleFile) -> None:
        self.rule = rule
        self.name = rule.name
        self.index = index
        self.line = line
        self.group = rule.group
        # Rules without a group never compete; a name cannot contain "\x00".
        self.group_key = rule.group if rule.group is not None else "\x00" + rule.name
        self.priority = rule.priority
        self.action: Action = rule.action
        self.status = rule.status if rule.status is not None else 429
        self.max_wait = rule.max_wait
        self.response = rule.response if rule.response is not None else Response()
        header = None if rule.degrade is None else rule.degrade.header
        self.degrade_header = "X-RateLimit-Degraded" if header is True else (header or None)
        # a request's class (higher first) from an attribute: the first value listed
        # ranks highest; a value not listed, or none, below them all
        self.priority_from: tuple[str, dict[str, int]] | None = None
        if rule.priority_from is not None:
            order = rule.priority_from.order
            ranks = {value: len(order) - 1 - i for i, value in enumerate(order)}
            self.priority_from = (rule.priority_from.attribute, ranks)
        self.queue = rule.queue
        # requests of one key in flight at once (None: no such limit), each holding
        # a lease of ``lease`` seconds unless released first (`_holds`)
        self.concurrency = rule.concurrency
        self.lease = DEFAULT_LEASE if rule.lease is None else float(rule.lease)
        # whose hits a settle corrects (`_settle`): the statuses that count, and
        # whether they are the ones listed (True) or all but those (False)
        self.counted_statuses = _counted_statuses(rule)
        self.settles = rule.settle or rule.count is not None
        match = rule.match
        self.paths: tuple[Pattern, ...] = ()
        self.methods: frozenset[str] | None = None
        self.attributes: tuple[tuple[str, frozenset[str]], ...] = ()
        if match is not None:
            self.paths = tuple(parse_pattern(p) for p in as_list(match.paths))
            methods = as_list(match.methods)
            self.methods = frozenset(m.upper() for m in methods) if methods else None
            self.attributes = tuple(
                (name, frozenset(as_list(values)))
                for name, values in sorted(match.attributes.items())
            )
        self.by = tuple(as_list(rule.by))
        self.key: KeyFn = _key_function(self.by, client_ip_function(file.client_ip))
        if isinstance(rule.cost, int):
            self.cost, self.cost_attribute = rule.cost, None
        else:
            self.cost, self.cost_attribute = rule.cost.default, rule.cost.attribute
        algorithm = rule_algorithm(rule, file.defaults)
        on_failure = rule.on_failure or file.defaults.on_failure
        two_tier = (rule.store or file.defaults.store) == "two_tier"
        shards = rule.shards or 1
        rates = [parse_rate(r) for r in as_list(rule.rate)]
        # A rule's tiers are told apart by their rate, not their position, so that
        # reordering them in the file keeps their counters; "name@rate" counts under
        # the rule's name (see Limiter), so adding or removing a rate keeps them too.
        names = [rule.name] if len(rates) == 1 else [f"{rule.name}@{r}" for r in rates]
        plain = [
            LimitSpec(name, rate, algorithm, rule.burst, rule.refill, on_failure, two_tier, shards,
                      adaptive=rule.adaptive, calendar=rule.calendar)
            for name, rate in zip(names, rates, strict=True)
        ]  # fmt: skip
        self.limits = tuple(spec_for(rule, spec) for spec in plain)
        self.slots: tuple[int, ...] = ()
        self.rank = 0
        path_spec = min((p.specificity for p in self.paths), default=(0, 0))
        self.specificity = (*path_spec, len(self.attributes), self.methods is not None)

    def counts(self, status: int) -> bool:
        """Whether a response of ``status`` counts against this rule (every
        response does unless the rule says ``count``)."""
        counted = self.counted_statuses
        if counted is None:
            return True
        listed, ranges = counted
        return any(low <= status <= high for low, high in ranges) is listed

    def entry(self) -> Entry:
        """What the index files: the fields evaluation reads, unpacked in one step."""
        # A rule of its own needs no group bookkeeping, unless two of its path
        # patterns can both match one request: then its unique key dedupes it.
        group = self.group
        if group is None and len(self.paths) > 1:
            group = self.group_key
        # slot and cost when one Applicable with a fixed cost is all it gives
        simple = len(self.slots) == 1 and self.cost_attribute is None
        slot = self.slots[0] if simple else -1
        return (group, self.rank, self.methods, self.attributes, self.key, self, slot, self.cost)

    def applicable(self, key: str, attributes: Mapping[str, object]) -> list[Applicable]:
        cost = self.cost_of(attributes)
        return [
            Applicable(self, slot, key, cost, spec)
            for slot, spec in zip(self.slots, self.limits, strict=True)
        ]

    def priority_of(self, attributes: Mapping[str, object]) -> int:
        """The request's class under ``priority_from`` (higher waits less); 0 without."""
        if self.priority_from is None:
            return 0
        name, ranks = self.priority_from
        value = attributes.get(name)
        if value is None:
            return -1
        return ranks.get(value if type(value) is str else text_of(value), -1)

    def cost_of(self, attributes: Mapping[str, object]) -> int:
        if self.cost_attribute is None:
            return self.cost
        value = attributes.get(self.cost_attribute)
        if type(value) is int:
            return value if value > 0 else 1
        try:
            number: int = int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError, OverflowError):
            return self.cost
        return max(1, number)  # every request is checked, even an empty one

    def __repr__(self) -> str:
        return f"<CompiledRule {self.name!r} group={self.group!r} rank={self.rank}>"


def ceiling_of(limit: int, full_at: float) -> int:
    """What a degrade rule's limiter counts up to: ``full_at`` times its limit,
    rounded up (1.1 x 100 is 110, not the 111 a float would make of it)."""
    return max(limit + 1, math.ceil(round(limit * full_at, 6)))


def ceiling_start(ceiling: int, full_at: float) -> int:
    """The limit whose `ceiling_of` is ``ceiling``: where degrading starts."""
    return math.floor(round(ceiling / full_at, 6))


def spec_for(rule: Rule, plain: LimitSpec) -> LimitSpec:
    """One rate of a rule as its limiter counts it (``plain``: as most rules do).
    A queue is a leaky bucket one request deep plus the line that may wait (no
    longer than ``max_wait`` at the rate); a degrade rule with ``full_at`` counts
    up to that multiple of its limit."""
    if rule.action == "queue":
        line = rule.queue or 0
        if rule.max_wait is not None:
            line = min(line, int(rule.max_wait * plain.rate.limit / plain.rate.period))
        return dataclasses.replace(plain, burst=line + 1)
    full_at = None if rule.degrade is None else rule.degrade.full_at
    if full_at is not None:
        rate = plain.rate
        ceiling = Rate(ceiling_of(rate.limit, full_at), rate.period)
        return dataclasses.replace(plain, rate=ceiling, degrade_from=rate.limit)
    return plain


class Applicable(msgspec.Struct, frozen=True, gc=False):
    """One limit that applies to a request: the rule, which of its rates (``slot``
    indexes the engine's limiters), the key built from ``by``, the cost, and the
    limit in force: the rule's own, or the one a runtime override or an adaptive
    limit puts in its place, which the headers and reports show."""

    rule: CompiledRule
    slot: int
    key: str
    cost: int
    limit: LimitSpec


def _escape(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F")


def _key_function(
    by: tuple[str, ...], client_ip: Callable[[Mapping[str, object]], object]
) -> KeyFn:
    """A function building the counter key from the ``by`` attributes, or ``None``
    when one is missing or empty. One attribute: its value as it is. Several: the
    values joined by '/', each with '%' and '/' escaped so no two differ only in
    where a value ends."""
    getters = [_getter(name, client_ip) for name in by]
    if not getters:
        return lambda attributes: ""
    if len(getters) == 1:
        get = getters[0]
        plain_ip = by[0] == "ip" and client_ip is peer_ip
        if plain_ip or (by[0] != "ip" and not by[0].startswith("header:")):
            name = by[0]

            def one(attributes: Mapping[str, object]) -> str | None:
                value = attributes.get(name)
                if type(value) is str:
                    return value or None
                return None if value is None else str(value)

            return one

        def one_of_ip_or_header(attributes: Mapping[str, object]) -> str | None:
            value = get(attributes)
            if value is None or value == "":
                return None
            return value if type(value) is str else str(value)

        return one_of_ip_or_header

    def several(attributes: Mapping[str, object]) -> str | None:
        parts = []
        for get in getters:
            value = get(attributes)
            if value is None or value == "":
                return None
            parts.append(_escape(value if type(value) is str else str(value)))
        return "/".join(parts)

    return several


def _getter(
    name: str, client_ip: Callable[[Mapping[str, object]], object]
) -> Callable[[Mapping[str, object]], object]:
    if name == "ip":
        return client_ip
    if name.startswith("header:"):
        header = name.removeprefix("header:").lower()

        def get_header(attributes: Mapping[str, object]) -> object:
            headers = attributes.get("headers")
            return headers.get(header) if isinstance(headers, Mapping) else None

        return get_header
    return lambda attributes: attributes.get(name)


METHODS = {m: m for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")}


def normal_method(method: object) -> str | None:
    """The method upper-case, as rules hold it (a dict lookup for the usual ones)."""
    if method is None:
        return None
    if type(method) is not str:
        method = str(method)
    return method if method.isupper() else method.upper()


def as_text(value: object) -> str | None:
    return value if value is None or type(value) is str else text_of(value)


def text_of(value: object) -> str:
    if type(value) is bool:  # as the rule file (YAML) spells it, not Python's "True"
        return "true" if value else "false"
    return str(value)

"""A checked `RuleFile` compiled into a `RuleSet`: an index that answers "which
limits apply to this request" without looking at every rule.

Each rule is filed once under its most selective condition (its path patterns in
the `PathIndex`; else its first attribute condition in a dict keyed by value;
else its methods; else the short list of rules that apply everywhere). A request
gathers the few candidates those lookups return, checks their remaining
conditions, and keeps per group the candidate that ranks first. Pure logic: no
store, no clock, no I/O; the engine binds limits to a store.

Ranking, within a group: higher ``priority`` first; on equal priority the more
specific rule (exact path > ``{param}`` > glob > prefix > no path; then more
attribute conditions; then a method condition); then file order. A rule without
a group is a group of its own, so it always applies when it matches.

A rule whose ``by`` attribute is missing from a request (or empty) does not
apply to it, and the next rule of its group gets the chance: "per user, else per
ip" is two rules in one group. Not a shared "unknown" counter, which would let
one anonymous client lock out every other; not an error, since a missing user is
usually just an anonymous caller. Because a rule that does not apply can be
skipped by leaving the attribute out, a group that must hold for everyone ends
with a fallback (``by: ip``, or no ``by`` for one counter shared by all), and
``ratewarden explain`` shows which rule each request falls to.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec

from .._rate import Rate, parse_rate
from ._clientip import client_ip_function, peer_ip
from ._errors import Problem
from ._paths import PathIndex, Pattern, normalize_path, parse_pattern, walk
from ._reach import unreachable
from ._schema import (
    Action,
    AdaptiveLimit,
    FailurePolicy,
    Refill,
    Response,
    Rule,
    RuleFile,
    as_list,
    from_document,
    rule_algorithm,
)
from ._source import Document, parse_text, read_file

__all__ = [
    "Applicable",
    "CompiledRule",
    "Explanation",
    "LimitSpec",
    "RuleSet",
    "compile_rules",
    "load",
    "loads",
]

KeyFn = Callable[[Mapping[str, object]], "str | None"]
# (group, rank, methods, attribute conditions, key function, rule, slot, cost)
_Entry = tuple[
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


class CompiledRule:
    """A rule ready to match; ``rule`` is the `Rule` as the file said it."""

    __slots__ = (
        "action",
        "attributes",
        "by",
        "cost",
        "cost_attribute",
        "degrade_header",
        "group",
        "group_key",
        "index",
        "key",
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
                      adaptive=rule.adaptive)
            for name, rate in zip(names, rates, strict=True)
        ]  # fmt: skip
        self.limits = tuple(_spec(rule, spec) for spec in plain)
        self.slots: tuple[int, ...] = ()
        self.rank = 0
        path_spec = min((p.specificity for p in self.paths), default=(0, 0))
        self.specificity = (*path_spec, len(self.attributes), self.methods is not None)

    def entry(self) -> _Entry:
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
        return [Applicable(self, slot, key, cost) for slot in self.slots]

    def priority_of(self, attributes: Mapping[str, object]) -> int:
        """The request's class under ``priority_from`` (higher waits less); 0 without."""
        if self.priority_from is None:
            return 0
        name, ranks = self.priority_from
        value = attributes.get(name)
        if value is None:
            return -1
        return ranks.get(value if type(value) is str else _text(value), -1)

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


def _spec(rule: Rule, plain: LimitSpec) -> LimitSpec:
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
    indexes the engine's limiters), the key built from ``by`` and the cost."""

    rule: CompiledRule
    slot: int
    key: str
    cost: int

    @property
    def limit(self) -> LimitSpec:
        return self.rule.limits[self.rule.slots.index(self.slot)]


class Overridden(Applicable, frozen=True, gc=False):
    """An `Applicable` whose limit a runtime override replaces (see _overrides):
    its headers and reports show the limit in force, not the file's."""

    spec: LimitSpec

    @property
    def limit(self) -> LimitSpec:
        return self.spec


@dataclass(frozen=True, slots=True)
class Explanation:
    """What one rule made of one request, for ``ratewarden explain``."""

    rule: CompiledRule
    verdict: str  # "applies", "lost", "no match", "skipped"
    reason: str
    key: str | None = None
    cost: int | None = None


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


_METHODS = {m: m for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")}


def _normal_method(method: object) -> str | None:
    """The method upper-case, as rules hold it (a dict lookup for the usual ones)."""
    if method is None:
        return None
    if type(method) is not str:
        method = str(method)
    return method if method.isupper() else method.upper()


def _as_text(value: object) -> str | None:
    return value if value is None or type(value) is str else _text(value)


def _text(value: object) -> str:
    if type(value) is bool:  # as the rule file (YAML) spells it, not Python's "True"
        return "true" if value else "false"
    return str(value)


class RuleSet:
    """A compiled rule file. ``evaluate(attributes)`` returns the `Applicable`
    limits for one request, pure and quick; ``explain`` says why, rule by rule."""

    def __init__(
        self, rule_file: RuleFile, rules: list[CompiledRule], document: Document | None
    ) -> None:
        self.file = rule_file
        self.source = None if document is None else document.filename
        self.rules = tuple(rules)
        self.by_name = {r.name: r for r in rules}
        # Decision.rule is a limiter's name: one per rate of a rule with several
        self.by_limit_name = {spec.name: r for r in rules for spec in r.limits}
        self.slot_count = sum(len(r.limits) for r in rules)
        self.limits: tuple[LimitSpec, ...] = tuple(s for r in rules for s in r.limits)
        # queue and degrade rules take more than the one store call (rules/_actions)
        self.shaping = any(r.action in ("queue", "degrade") for r in rules)
        # the load signals the adaptive rules read
        self.signals = frozenset(
            r.rule.adaptive.signal for r in rules if r.rule.adaptive is not None
        )
        self._always: list[_Entry] = []
        self._fixed: list[Applicable] = []
        self._paths: PathIndex[_Entry] = PathIndex()
        self._by_method: dict[str, list[_Entry]] = {}
        self._by_attribute: dict[str, dict[str, list[_Entry]]] = {}
        for rule in rules:
            entry = rule.entry()
            if rule.paths:
                for pattern in rule.paths:
                    self._paths.add(pattern, entry)
            elif rule.attributes:
                name, values = rule.attributes[0]
                table = self._by_attribute.setdefault(name, {})
                for value in values:
                    table.setdefault(value, []).append(entry)
            elif rule.methods is not None:
                for method in rule.methods:
                    self._by_method.setdefault(method, []).append(entry)
            elif not rule.by and rule.group is None and entry[6] >= 0:
                # applies to every request with the same key and cost: built once
                self._fixed.append(Applicable(rule, entry[6], "", rule.cost))
            else:
                self._always.append(entry)
        self._attribute_tables = tuple(self._by_attribute.items())
        self._exact_paths = self._paths.exact
        self._trie = self._paths.root if self._paths.trie_used else None
        self.warnings: tuple[Problem, ...] = tuple(unreachable(rules, self.source or "<rules>"))

    def __len__(self) -> int:
        return len(self.rules)

    def __repr__(self) -> str:
        source = "" if self.source is None else f" from {self.source!r}"
        return f"<RuleSet {len(self.rules)} rules, {self.slot_count} limits{source}>"

    def evaluate(self, attributes: Mapping[str, object]) -> list[Applicable]:  # noqa: PLR0915
        """The limits that apply to a request described by ``attributes`` (method,
        path, ip, user, api_key, plan, headers (lower-case names) ...). Pure:
        counts nothing. The order is the same for the same request and rules.

        The hot path of every request, so written flat (no helper calls, index
        entries unpacked as tuples): one pass gathers the candidates from the
        indexes, one pass checks them and keeps the first of each group (a
        candidate whose group is already taken by a rule that ranks first is
        dropped before its key is built). About 2 us at 10 rules, 3.5 us at
        10,000 on the project VM (bench/bench_rules.py)."""
        get = attributes.get
        raw = get("method")
        if type(raw) is str:
            method = _METHODS.get(raw) or _normal_method(raw)
        else:
            method = None if raw is None else _normal_method(raw)
        found: list[_Entry] = []
        path = get("path")
        if type(path) is str:
            if "?" in path or "%" in path or "/." in path or "//" in path or path[:1] != "/":
                path = normalize_path(path)  # rare; the common path costs a few scans
            exact = self._exact_paths.get(path)
            if exact is not None:
                found += exact
            if self._trie is not None:
                segments = path[1:].split("/")
                walk(self._trie, segments, 0, len(segments), found)
        if self._by_method:
            rules = self._by_method.get(method or "")
            if rules:
                found += rules
        for name, table in self._attribute_tables:
            value = get(name)
            if value is not None:
                rules = table.get(value if type(value) is str else _text(value))
                if rules:
                    found += rules
        out = self._fixed.copy()
        best: dict[str, tuple[int, CompiledRule, str, int, int]] = {}
        for group, rank, _, _, key_of, rule, slot, cost in self._always:  # nothing to check
            if group is not None:
                current = best.get(group)
                if current is not None and current[0] < rank:
                    continue
            key = key_of(attributes)
            if key is not None:
                if group is not None:
                    best[group] = (rank, rule, key, slot, cost)
                elif slot >= 0:
                    out.append(Applicable(rule, slot, key, cost))
                else:
                    out += rule.applicable(key, attributes)
        for group, rank, methods, conditions, key_of, rule, slot, cost in found:
            if group is not None:
                current = best.get(group)
                if current is not None and current[0] < rank:
                    continue
            if methods is not None and method not in methods:
                continue
            if conditions:
                holds = True
                for name, values in conditions:
                    value = get(name)
                    if (value if type(value) is str else _as_text(value)) not in values:
                        holds = False
                        break
                if not holds:
                    continue
            key = key_of(attributes)
            if key is not None:
                if group is not None:
                    best[group] = (rank, rule, key, slot, cost)
                elif slot >= 0:
                    out.append(Applicable(rule, slot, key, cost))
                else:
                    out += rule.applicable(key, attributes)
        for _, rule, key, slot, cost in best.values():
            if slot >= 0:
                out.append(Applicable(rule, slot, key, cost))
            else:
                out += rule.applicable(key, attributes)
        return out

    def explain(self, attributes: Mapping[str, object]) -> list[Explanation]:
        """Every rule's verdict on the request, in file order: it applies (with its
        key and cost), it lost to a higher-ranked rule of its group, it does not
        match (and why), or it was skipped for want of its ``by`` attribute."""
        applied = {a.rule.name: a for a in self.evaluate(attributes)}
        winners = {a.rule.group_key: a.rule for a in applied.values()}
        out = []
        method = _normal_method(attributes.get("method"))
        path = attributes.get("path")
        if isinstance(path, str):
            path = normalize_path(path)
        for rule in self.rules:
            reason = _mismatch(rule, attributes, method, path)
            if reason is not None:
                out.append(Explanation(rule, "no match", reason))
                continue
            key = rule.key(attributes)
            if key is None:
                missing = ", ".join(rule.by)
                out.append(Explanation(rule, "skipped", f"no value for by: {missing}"))
            elif rule.name in applied:
                why = "matches" + (f"; first in group {rule.group!r}" if rule.group else "")
                out.append(Explanation(rule, "applies", why, key, rule.cost_of(attributes)))
            else:
                winner = winners.get(rule.group_key)
                first = "another rule" if winner is None else repr(winner.name)
                why = f"matches, but {first} ranks first in group {rule.group!r}"
                out.append(Explanation(rule, "lost", why, key))
        return out


def _mismatch(
    rule: CompiledRule, attributes: Mapping[str, object], method: object, path: object
) -> str | None:
    if rule.paths:
        text = path if isinstance(path, str) else None  # normalized by the caller
        if text is None or not any(re.fullmatch(p.regex, text[1:]) for p in rule.paths):
            wanted = ", ".join(p.text for p in rule.paths)
            return f"path {path!r} is not {wanted}"
    if rule.methods is not None and method not in rule.methods:
        return f"method {method!r} is not {', '.join(sorted(rule.methods))}"
    for name, values in rule.attributes:
        if _as_text(attributes.get(name)) not in values:
            wanted = ", ".join(sorted(values))
            return f"{name} is {attributes.get(name)!r}, not {wanted}"
    return None


def compile_rules(rule_file: RuleFile, document: Document | None = None) -> RuleSet:
    """Compile a checked `RuleFile` (see `_schema.from_document`)."""
    rules = []
    for i, spec in enumerate(rule_file.rules):
        line = None if document is None else document.line_of(f"$.rules[{i}]")
        rules.append(CompiledRule(spec, i, line, rule_file))
    ordered = sorted(rules, key=lambda r: (-r.priority, _negate(r.specificity), r.index))
    for rank, rule in enumerate(ordered):
        rule.rank = rank
    slot = 0
    for rule in rules:
        rule.slots = tuple(range(slot, slot + len(rule.limits)))
        slot += len(rule.limits)
    return RuleSet(rule_file, rules, document)


def _negate(specificity: tuple[int, int, int, bool]) -> tuple[int, ...]:
    return tuple(-int(x) for x in specificity)


def load(path: str | os.PathLike[str]) -> RuleSet:
    """Read, check and compile the rule file at ``path``; `RuleFileError` (a
    `ConfigurationError`) naming file, line, rule and field for anything wrong."""
    document = read_file(path)
    return compile_rules(from_document(document), document)


def loads(text: str, filename: str = "<string>") -> RuleSet:
    """`load` for rule-file text already in memory."""
    document = parse_text(text, filename)
    return compile_rules(from_document(document), document)

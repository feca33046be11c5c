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

Warnings for rules that can never apply: an earlier-ranked rule of their group
matches every request they match; or they read an attribute that no front end
gives and the file does not declare (`_schema_checks.undeclared`).

Not part of matching: compiling a rule file runs it once so that ``ratewarden
check`` and a reload can say which rules are dead weight.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ._paths import PathIndex, Pattern, normalize_path, walk
from ._rule import (
    METHODS,
    Applicable,
    CompiledRule,
    Entry,
    LimitSpec,
    as_text,
    ceiling_of,
    ceiling_start,
    normal_method,
    text_of,
)
from ._schema import RuleFile
from ._schema_checks import from_document, undeclared
from .source import Document, Problem, parse_text, read_file

__all__ = [
    "Applicable",
    "CompiledRule",
    "Explanation",
    "LimitSpec",
    "RuleSet",
    "ceiling_of",
    "ceiling_start",
    "compile_rules",
    "load",
    "loads",
    "unreachable",
]


@dataclass(frozen=True, slots=True)
class Explanation:
    """What one rule made of one request, for ``ratewarden explain``."""

    rule: CompiledRule
    verdict: str  # "applies", "lost", "no match", "skipped"
    reason: str
    key: str | None = None
    cost: int | None = None


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
        # rules whose hits are settled after the request ran (`_settle`)
        self.settling = any(r.settles for r in rules)
        # the load signals the adaptive rules read
        self.signals = frozenset(
            r.rule.adaptive.signal for r in rules if r.rule.adaptive is not None
        )
        self._always: list[Entry] = []
        self._fixed: list[Applicable] = []
        self._paths: PathIndex[Entry] = PathIndex()
        self._by_method: dict[str, list[Entry]] = {}
        self._by_attribute: dict[str, dict[str, list[Entry]]] = {}
        # the concurrency rules, matched one by one (`holds`): few, and held for
        # the request's whole life, which costs more than the matching
        self.concurrent = tuple(r for r in rules if r.concurrency is not None)
        for rule in rules:
            if not rule.limits:  # a concurrency limit and no rate: nothing to count
                continue
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
                self._fixed.append(Applicable(rule, entry[6], "", rule.cost, rule.limits[0]))
            else:
                self._always.append(entry)
        self._attribute_tables = tuple(self._by_attribute.items())
        self._exact_paths = self._paths.exact
        self._trie = self._paths.root if self._paths.trie_used else None
        warnings = unreachable(rules, self.source or "<rules>") + undeclared(rule_file, document)
        self.warnings: tuple[Problem, ...] = tuple(sorted(warnings, key=lambda w: w.line or 0))

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
            method = METHODS.get(raw) or normal_method(raw)
        else:
            method = None if raw is None else normal_method(raw)
        found: list[Entry] = []
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
                rules = table.get(value if type(value) is str else text_of(value))
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
                    out.append(Applicable(rule, slot, key, cost, rule.limits[0]))
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
                    if (value if type(value) is str else as_text(value)) not in values:
                        holds = False
                        break
                if not holds:
                    continue
            key = key_of(attributes)
            if key is not None:
                if group is not None:
                    best[group] = (rank, rule, key, slot, cost)
                elif slot >= 0:
                    out.append(Applicable(rule, slot, key, cost, rule.limits[0]))
                else:
                    out += rule.applicable(key, attributes)
        for _, rule, key, slot, cost in best.values():
            if slot >= 0:
                out.append(Applicable(rule, slot, key, cost, rule.limits[0]))
            else:
                out += rule.applicable(key, attributes)
        return out

    def holds(self, attributes: Mapping[str, object]) -> list[tuple[CompiledRule, str, int]]:
        """The concurrency rules that apply to a request, each with its key and
        the request's priority class under it (`CompiledRule.priority_of`), in
        file order: those whose conditions hold and whose ``by`` attributes it has."""
        if not self.concurrent:
            return []
        method = normal_method(attributes.get("method"))
        path = attributes.get("path")
        if isinstance(path, str):
            path = normalize_path(path)
        out = []
        for rule in self.concurrent:
            if _mismatch(rule, attributes, method, path) is None:
                key = rule.key(attributes)
                if key is not None:
                    out.append((rule, key, rule.priority_of(attributes)))
        return out

    def explain(self, attributes: Mapping[str, object]) -> list[Explanation]:
        """Every rule's verdict on the request, in file order: it applies (with its
        key and cost), it lost to a higher-ranked rule of its group, it does not
        match (and why), or it was skipped for want of its ``by`` attribute."""
        applied = {a.rule.name: a for a in self.evaluate(attributes)}
        winners = {a.rule.group_key: a.rule for a in applied.values()}
        out = []
        method = normal_method(attributes.get("method"))
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
            elif rule.name in applied or rule.concurrency is not None:  # never in a group
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
        if as_text(attributes.get(name)) not in values:
            wanted = ", ".join(sorted(values))
            return f"{name} is {attributes.get(name)!r}, not {wanted}"
    return None


def compile_rules(rule_file: RuleFile, document: Document | None = None) -> RuleSet:
    """Compile a checked `RuleFile` (see `_schema_checks.from_document`)."""
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


def _covers(a: CompiledRule, b: CompiledRule) -> bool:
    """Whether every request ``b`` applies to, ``a`` applies to (conservatively:
    False when unsure)."""
    if not set(a.by) <= set(b.by):
        return False
    if a.methods is not None and (b.methods is None or not b.methods <= a.methods):
        return False
    b_attributes = dict(b.attributes)
    for name, values in a.attributes:
        if name not in b_attributes or not b_attributes[name] <= values:
            return False
    if not a.paths:
        return True
    if not b.paths:
        return False
    return all(any(_pattern_covers(p, q) for p in a.paths) for q in b.paths)


def _pattern_covers(p: Pattern, q: Pattern) -> bool:
    if p.text == q.text:
        return True
    # A prefix pattern's stem and tail are literal, so a pattern whose text starts
    # with the same characters only matches paths that start with them too.
    return p.kind == "prefix" and None not in p.stem and q.text.startswith(p.text[:-1])


def unreachable(rules: list[CompiledRule], filename: str) -> list[Problem]:
    """Warnings for rules that an earlier-ranked rule of their group always beats.

    Comparing every pair would take minutes at 10,000 rules, so each group files
    the rules seen so far where a rule they could cover would look: rules without
    paths under their first attribute condition (or in ``broad`` without one), and
    rules with paths under each pattern's text and, for literal prefix patterns,
    under the prefix. A rule is then compared only with the rules found there."""
    warnings = []
    groups: dict[str, list[CompiledRule]] = {}
    for rule in sorted(rules, key=lambda r: r.rank):
        if rule.group is not None:
            groups.setdefault(rule.group, []).append(rule)
    for members in groups.values():
        broad: list[CompiledRule] = []
        by_attribute: dict[tuple[str, str], list[CompiledRule]] = {}
        by_text: dict[str, list[CompiledRule]] = {}
        by_prefix: dict[str, list[CompiledRule]] = {}
        for rule in members:
            candidates = list(broad)
            for name, values in rule.attributes:
                for value in values:
                    candidates += by_attribute.get((name, value), ())
            for q in rule.paths:
                candidates += by_text.get(q.text, ())
                for end in range(len(q.text) + 1):
                    candidates += by_prefix.get(q.text[:end], ())
            for earlier in candidates:
                if _covers(earlier, rule):
                    reason = (
                        f"never applies: {earlier.name!r} (line {earlier.line}) ranks before it"
                        f" in group {rule.group!r} and matches every request it matches"
                    )
                    warnings.append(Problem(filename, rule.line, rule.name, None, reason))
                    break
            if not rule.paths:
                if not rule.attributes:
                    broad.append(rule)
                else:
                    name, values = rule.attributes[0]
                    for value in values:
                        by_attribute.setdefault((name, value), []).append(rule)
            for p in rule.paths:
                by_text.setdefault(p.text, []).append(rule)
                if p.kind == "prefix" and None not in p.stem:
                    by_prefix.setdefault(p.text[:-1], []).append(rule)
    return sorted(warnings, key=lambda w: w.line or 0)

"""Warnings for rules that can never apply: an earlier-ranked rule of their group
matches every request they match.

Not part of matching: compiling a rule file runs it once so that ``ratewarden
check`` and a reload can say which rules are dead weight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import Problem
from ._paths import Pattern

if TYPE_CHECKING:
    from ._compile import CompiledRule

__all__ = ["unreachable"]


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

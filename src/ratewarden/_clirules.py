"""``ratewarden check-config`` and ``ratewarden explain``: rule files as tables."""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError

if TYPE_CHECKING:
    from .rules import CompiledRule

__all__ = ["check_config", "explain", "table"]


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]  # fmt: skip
    return "\n".join(lines)


def _where(rule: CompiledRule) -> str:
    parts = []
    if rule.methods is not None:
        parts.append("|".join(sorted(rule.methods)))
    if rule.paths:
        parts.append(" ".join(p.text for p in rule.paths))
    parts.extend(f"{name}={'|'.join(sorted(values))}" for name, values in rule.attributes)
    return " ".join(parts) or "*"


def _action(rule: CompiledRule) -> str:
    if rule.action == "reject":
        return f"reject {rule.status}"
    if rule.action == "delay":
        return f"delay <={rule.max_wait:g}s"
    if rule.action == "shadow_ban":
        return f"shadow_ban {rule.response.status}"
    return rule.action


def _envoy_format(path: str) -> bool:
    """Whether ``path`` is envoyproxy/ratelimit configuration: a directory of it (a
    ConfigMap), or a file whose top level names a ``domain`` and no ``rules``."""
    if os.path.isdir(path):
        return True
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            head = file.read(1 << 20)
    except OSError:
        return False  # the rule loader says what is wrong with it
    return bool(re.search(r"^domain\s*:", head, re.M)) and not re.search(r"^rules\s*:", head, re.M)


def _envoy_rows(domain: str, level: Any, prefix: str, rows: list[list[str]]) -> None:
    nodes = [*level.exact.values(), *level.any_value.values()]
    nodes += [node for entries in level.wildcards.values() for _, node in entries]
    for node in nodes:
        here = f"{prefix}{node.key}" + ("" if node.value is None else f"={node.value}")
        spec = node.limit
        if spec is not None:
            flags = [name for name in ("shadow", "quota", "detailed") if getattr(spec, name)]
            if spec.replaces:
                flags.append("replaces " + ",".join(sorted(spec.replaces)))
            rate = "unlimited" if spec.unlimited else f"{spec.requests_per_unit}/{spec.unit}"
            rows.append([domain, here, rate, spec.name or "-", " ".join(flags) or "-"])
        _envoy_rows(domain, node.children, here + " > ", rows)


def check_envoy_config(path: str) -> int:
    """`check_config` for envoyproxy/ratelimit configuration, checked as the service
    loads it with ``--envoy-config``."""
    from .rules import EnvoyConfig, RuleFileError  # noqa: PLC0415 - PyYAML only when asked for

    try:
        config = EnvoyConfig.load(path)
    except RuleFileError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        print(f"{path}: envoyproxy/ratelimit configuration, not loaded "
              f"({len(exc.problems)} problem(s))", file=sys.stderr)  # fmt: skip
        return 1
    rows = [["domain", "descriptor", "rate", "name", "flags"]]
    for domain, root in config.domains.items():
        _envoy_rows(domain, root, "", rows)
    print(table(rows))
    limits = len(rows) - 1
    print(f"{path}: envoyproxy/ratelimit configuration (serve it with --envoy-config):"
          f" {len(config.domains)} domain(s), {limits} descriptor(s) with a limit")  # fmt: skip
    return 0


def check_config(path: str, *, strict: bool) -> int:
    """Print the compiled rules as a table; 1 for a bad file (or warnings, if strict)."""
    if _envoy_format(path):
        return check_envoy_config(path)
    from .rules import RuleFileError, load  # noqa: PLC0415 - PyYAML only when asked for

    try:
        ruleset = load(path)
    except RuleFileError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        print(f"{path}: not loaded ({len(exc.problems)} problem(s))", file=sys.stderr)
        return 1
    header = ["name", "group", "priority", "rank", "where", "by", "rate", "algorithm", "cost",
              "action", "on_failure"]  # fmt: skip
    rows = [header]
    for rule in ruleset.rules:
        spec = rule.limits[0]
        rows.append([
            rule.name, rule.group or "-", str(rule.priority), str(rule.rank), _where(rule),
            ",".join(rule.by) or "-", ", ".join(str(s.rate) for s in rule.limits),
            spec.algorithm + (f" burst={spec.burst}" if spec.burst else ""),
            str(rule.cost) if rule.cost_attribute is None else f"@{rule.cost_attribute}",
            _action(rule), spec.on_failure,
        ])  # fmt: skip
    print(table(rows))
    for warning in ruleset.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{path}: {len(ruleset)} rules, {ruleset.slot_count} limits, "
          f"{len(ruleset.warnings)} warning(s)")  # fmt: skip
    return 1 if strict and ruleset.warnings else 0


def _attributes(pairs: list[str], headers: list[str]) -> dict[str, object]:
    attributes: dict[str, object] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ConfigurationError(f"--attr takes name=value, got {pair!r}")
        attributes[name] = value
    header_map: dict[str, str] = {}
    for pair in headers:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ConfigurationError(f"--header takes name=value, got {pair!r}")
        header_map[name.lower()] = value
    if header_map:
        attributes["headers"] = header_map
    return attributes


def explain(path: str, pairs: list[str], headers: list[str]) -> int:
    """Show what every rule makes of one request, and which limits apply."""
    from .rules import RuleFileError, load  # noqa: PLC0415 - PyYAML only when asked for

    try:
        ruleset = load(path)
    except RuleFileError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1
    attributes = _attributes(pairs, headers)
    print("request: " + (" ".join(f"{k}={v!r}" for k, v in attributes.items()) or "(empty)"))
    rows = [["verdict", "rule", "group", "why", "key", "cost", "limits", "action"]]
    for e in ruleset.explain(attributes):
        applies = e.verdict == "applies"
        rows.append([
            e.verdict, e.rule.name, e.rule.group or "-", e.reason,
            "-" if e.key is None else repr(e.key), "-" if e.cost is None else str(e.cost),
            ", ".join(str(s.rate) for s in e.rule.limits) if applies else "",
            _action(e.rule) if applies else "",
        ])  # fmt: skip
    print(table(rows))
    applied = ruleset.evaluate(attributes)
    names = sorted({a.rule.name for a in applied}, key=lambda n: ruleset.by_name[n].rank)
    print(f"{len(names)} rule(s), {len(applied)} limit(s) apply: {', '.join(names) or 'none'}")
    return 0


# -- ratewarden quota ---------------------------------------------------------------

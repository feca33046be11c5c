"""``ratewarden check-config`` and ``ratewarden explain``: rule files as tables."""

from __future__ import annotations

import math
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from ..kernel import Adaptive
from ..primitives import ConfigurationError
from ._common import print_json, spinning, table

if TYPE_CHECKING:
    from ..rules import CompiledRule

__all__ = ["check_config", "explain", "table"]

ENVOY = "envoyproxy/ratelimit"


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
    if rule.action == "queue":
        wait = "" if rule.max_wait is None else f" <={rule.max_wait:g}s"
        return f"queue {rule.rule.queue}{wait}"
    if rule.action == "degrade" and rule.rule.degrade is not None and rule.rule.degrade.full_at:
        return f"degrade to {rule.rule.degrade.full_at:g}x"
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


def _envoy_rows(domain: str, level: Any, prefix: str, rows: list[dict[str, Any]]) -> None:
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
            rows.append({"domain": domain, "descriptor": here, "rate": rate,
                         "name": spec.name, "flags": flags})  # fmt: skip
        _envoy_rows(domain, node.children, here + " > ", rows)


def _refused(command: str, path: str, what: str, problems: list[str], as_json: bool = False) -> int:
    """A file that does not load: every problem on stderr (in the JSON, with
    ``--json``), then the line that sums it up, as check and bench end theirs; 1."""
    if as_json:
        print_json({"file": path, "format": what, "loaded": False, "errors": problems})
        return 1
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    kind = "" if what == "rules" else f"{what} configuration, "
    print(f"ratewarden {command}: {path}: {kind}not loaded ({len(problems)} problem(s))",
          file=sys.stderr)  # fmt: skip
    return 1


def check_envoy_config(path: str, *, as_json: bool = False) -> int:
    """`check_config` for envoyproxy/ratelimit configuration, checked as the service
    loads it with ``--envoy-config``."""
    from ..rules import EnvoyConfig, RuleFileError  # noqa: PLC0415 - PyYAML only when asked for

    try:
        with spinning(f"loading {path}", json=as_json):
            config = EnvoyConfig.load(path)
    except RuleFileError as exc:
        return _refused("check-config", path, ENVOY, [str(p) for p in exc.problems], as_json)
    limits: list[dict[str, Any]] = []
    for domain, root in config.domains.items():
        _envoy_rows(domain, root, "", limits)
    if as_json:
        print_json({"file": path, "format": ENVOY, "loaded": True,
                    "domains": sorted(config.domains), "limits": limits})  # fmt: skip
        return 0
    rows = [["domain", "descriptor", "rate", "name", "flags"]]
    rows.extend([row["domain"], row["descriptor"], row["rate"], row["name"] or "-",
                 " ".join(row["flags"]) or "-"] for row in limits)  # fmt: skip
    print(table(rows))
    print(f"{path}: {ENVOY} configuration (serve it with --envoy-config): "
          f"{len(config.domains)} domain(s), {len(limits)} descriptor(s) with a limit")  # fmt: skip
    return 0


def check_config(path: str, *, strict: bool, as_json: bool = False) -> int:
    """Print the compiled rules as a table (or JSON); 1 for a bad file (or
    warnings, if strict)."""
    if _envoy_format(path):
        return check_envoy_config(path, as_json=as_json)
    from ..rules import RuleFileError, load  # noqa: PLC0415 - PyYAML only when asked for

    try:
        with spinning(f"loading {path}", json=as_json):
            ruleset = load(path)
    except RuleFileError as exc:
        return _refused("check-config", path, "rules", [str(p) for p in exc.problems], as_json)
    from ..rlqs import bucket_rules  # noqa: PLC0415 - with the rules

    try:
        buckets = bucket_rules(ruleset.file.rlqs)
    except ConfigurationError as exc:
        return _refused("check-config", path, "rules", [str(exc)], as_json)
    quotas: list[dict[str, Any]] = [
        {"name": b.name, "domain": b.domain, "bucket": dict(b.pattern), "rate": str(b.quota.rate),
         "algorithm": b.quota.algorithm, "lease": b.quota.lease, "ttl": b.ttl,
         "abandon_after": b.abandon_after}
        for b in buckets
    ]  # fmt: skip
    warnings = [str(w) for w in ruleset.warnings]
    code = 1 if strict and warnings else 0
    rules: list[dict[str, Any]] = [
        {
            "name": rule.name, "group": rule.group, "priority": rule.priority,
            "rank": rule.rank, "where": _where(rule), "by": list(rule.by),
            # as the file says them: a queue's bucket and a degrade rule's ceiling are
            # the engine's own, derived from them
            "rates": [str(s.file_rate) for s in rule.limits],
            "concurrency": rule.concurrency,
            "algorithm": rule.limits[0].algorithm if rule.limits else "-",
            "burst": rule.rule.burst,
            "calendar": None if rule.rule.calendar is None else {
                "tz": rule.rule.calendar.tz, "week_start": rule.rule.calendar.week_start},
            "cost": rule.cost if rule.cost_attribute is None else f"@{rule.cost_attribute}",
            "action": _action(rule),
            "on_failure": rule.limits[0].on_failure if rule.limits else "-",
        }
        for rule in ruleset.rules
    ]  # fmt: skip
    if as_json:
        print_json({"file": path, "format": "rules", "loaded": True, "rules": rules,
                    "limits": ruleset.slot_count, "rlqs": quotas,
                    "warnings": warnings})  # fmt: skip
        return code
    header = ["name", "group", "priority", "rank", "where", "by", "rate", "algorithm", "cost",
              "action", "on_failure"]  # fmt: skip
    rows = [header]
    rows.extend([
        r["name"], r["group"] or "-", str(r["priority"]), str(r["rank"]), r["where"],
        ",".join(r["by"]) or "-",
        ", ".join(r["rates"] + ([f"{r['concurrency']} at once"] if r["concurrency"] else [])),
        r["algorithm"] + (f" burst={r['burst']}" if r["burst"] else "")
        + (f" calendar={r['calendar']['tz']}" if r["calendar"] else ""), str(r["cost"]),
        r["action"], r["on_failure"],
    ] for r in rules)  # fmt: skip
    if rules or not quotas:
        print(table(rows))
    if buckets:
        print(table([["rlqs", "domain", "bucket", "rate", "algorithm", "lease", "ttl"]] + [
            [b.name, b.domain, ",".join(f"{k}={v}" for k, v in b.pattern) or "-",
             str(b.quota.rate), b.quota.algorithm, f"{b.quota.lease:g}s", f"{b.ttl}s"]
            for b in buckets]))  # fmt: skip
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    said = f", {len(quotas)} rlqs bucket entries" if quotas else ""
    print(f"{path}: {len(ruleset)} rules, {ruleset.slot_count} limits{said}, "
          f"{len(warnings)} warning(s)")  # fmt: skip
    return code


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


def _loads(pairs: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not name or not math.isfinite(number):
            raise ConfigurationError(f"--load takes SIGNAL=NUMBER, got {pair!r}")
        out[name] = number
    return out


def _limits(rule: CompiledRule, loads: dict[str, float]) -> list[str]:
    """The rule's limits; an adaptive one's with what the load leaves of it (at a
    steady ``--load``; the full limit until its signal is fed)."""
    adaptive = rule.rule.adaptive
    if adaptive is None:
        at_once = [] if rule.concurrency is None else [f"{rule.concurrency} at once"]
        return [str(s.file_rate) for s in rule.limits] + at_once
    value = loads.get(adaptive.signal)
    if value is None:
        return [f"{s.file_rate} (adaptive: {adaptive.signal} not fed)" for s in rule.limits]
    factor = Adaptive(lambda: value, good=adaptive.good, bad=adaptive.bad,
                      floor=adaptive.floor).factor_of(value)  # fmt: skip
    return [
        f"{s.rate} -> {max(1, math.floor(round(s.rate.limit * factor, 6)))} at"
        f" {adaptive.signal}={value:g}"
        for s in rule.limits
    ]


def explain(
    path: str, pairs: list[str], headers: list[str], *, as_json: bool = False,
    signals: list[str] | None = None,
) -> int:  # fmt: skip
    """Show what every rule makes of one request, and which limits apply; an
    adaptive limit at the ``signals`` given (``SIGNAL=VALUE``)."""
    from ..rules import RuleFileError, load  # noqa: PLC0415 - PyYAML only when asked for

    try:
        ruleset = load(path)
    except RuleFileError as exc:
        return _refused("explain", path, "rules", [str(p) for p in exc.problems])
    attributes = _attributes(pairs, headers)
    loads = _loads(signals or [])
    if as_json:
        return _explain_json(ruleset, attributes, loads)
    print("request: " + (" ".join(f"{k}={v!r}" for k, v in attributes.items()) or "(empty)"))
    rows = [["verdict", "rule", "group", "why", "key", "cost", "limits", "action"]]
    for e in ruleset.explain(attributes):
        applies = e.verdict == "applies"
        rows.append([
            e.verdict, e.rule.name, e.rule.group or "-", e.reason,
            "-" if e.key is None else repr(e.key), "-" if e.cost is None else str(e.cost),
            ", ".join(_limits(e.rule, loads)) if applies else "",
            _action(e.rule) if applies else "",
        ])  # fmt: skip
    print(table(rows))
    applied = ruleset.evaluate(attributes)
    names = sorted({a.rule.name for a in applied}, key=lambda n: ruleset.by_name[n].rank)
    print(f"{len(names)} rule(s), {len(applied)} limit(s) apply: {', '.join(names) or 'none'}")
    return 0


def _explain_json(ruleset: Any, attributes: dict[str, object], loads: dict[str, float]) -> int:
    """``explain --json``: the request, each rule's verdict, the rules that apply."""
    rules = [
        {
            "verdict": e.verdict, "rule": e.rule.name, "group": e.rule.group, "why": e.reason,
            "key": e.key, "cost": e.cost,
            "limits": _limits(e.rule, loads) if e.verdict == "applies" else [],
            "action": _action(e.rule) if e.verdict == "applies" else None,
        }
        for e in ruleset.explain(attributes)
    ]  # fmt: skip
    applied = ruleset.evaluate(attributes)
    names = sorted({a.rule.name for a in applied}, key=lambda n: ruleset.by_name[n].rank)
    print_json({"request": attributes, "rules": rules, "applies": names,
                "limits": len(applied)})  # fmt: skip
    return 0


# -- ratewarden quota ---------------------------------------------------------------

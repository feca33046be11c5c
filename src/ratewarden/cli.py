"""The ``ratewarden`` command: ``serve``, ``demo``, ``check-config FILE``,
``explain FILE --attr k=v``.

The rule commands import ``ratewarden.rules`` (and so PyYAML) only when they run,
``serve`` the server packages only when it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import __version__
from ._clock import FakeClock
from ._errors import ConfigurationError, RateLimitTimeout, RatewardenError
from ._limiter import AsyncLimiter, Limiter
from .algorithms import ALGORITHMS
from .stores import MemoryStore

if TYPE_CHECKING:
    from .rules import CompiledRule


def demo() -> None:
    print(f"ratewarden {__version__}: every algorithm, 5 per second, a burst of 8 requests")
    print("at t=0 then one request every 100 ms (simulated time).\n")
    print(f"{'algorithm':<24}{'burst':<10}then at t = 0.1 s, 0.2 s, ... 2.0 s")
    print(f"{'':<34}" + "".join(f"{t:>5}" for t in ("0.5s", "1.0s", "1.5s", "2.0s")))
    for name in ALGORITHMS:
        clock = FakeClock()
        limiter = Limiter("5/second", algorithm=name, store=MemoryStore(clock=clock))
        burst = "".join("#" if limiter.hit("demo").allowed else "." for _ in range(8))
        marks = []
        for _ in range(20):
            clock.advance(0.1)
            marks.append("#" if limiter.hit("demo").allowed else ".")
        print(f"{name:<24}{burst:<10}{''.join(marks)}")
    print("\n# admitted   . denied\n")

    print("acquire(): 4 async workers share one '10/second' gcra limit, burst 1 (real time)")
    shared = AsyncLimiter("10/second", algorithm="gcra", burst=1)

    async def worker(n: int, start: float) -> None:
        for _ in range(3):
            await shared.acquire("downstream-api", max_wait=2.0)
            print(f"  {time.monotonic() - start:5.2f}s  worker {n} got a permit")

    async def main() -> None:
        start = time.monotonic()
        await asyncio.gather(*(worker(n, start) for n in range(4)))

    asyncio.run(main())
    once = Limiter("1/minute", algorithm="token_bucket")
    once.acquire("k", max_wait=0)
    try:
        once.acquire("k", max_wait=0.5)
    except RateLimitTimeout as exc:
        print(f"\nwhen no permit can come in time: RateLimitTimeout: {exc}")


def _table(rows: list[list[str]]) -> str:
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


def check_config(path: str, *, strict: bool) -> int:
    """Print the compiled rules as a table; 1 for a bad file (or warnings, if strict)."""
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
    print(_table(rows))
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
    print(_table(rows))
    applied = ruleset.evaluate(attributes)
    names = sorted({a.rule.name for a in applied}, key=lambda n: ruleset.by_name[n].rank)
    print(f"{len(names)} rule(s), {len(applied)} limit(s) apply: {', '.join(names) or 'none'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ratewarden", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ratewarden {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the service: HTTP API, Envoy RLS gRPC, /auth")
    try:
        from .server import add_arguments  # noqa: PLC0415 - the server extra, if installed
    except ImportError:
        serve_missing = True
    else:
        serve_missing = False
        add_arguments(serve)
    sub.add_parser("demo", help="show every algorithm and acquire() at work")
    check = sub.add_parser("check-config", help="check a rule file; print its compiled rules")
    check.add_argument("file")
    check.add_argument("--strict", action="store_true", help="warnings fail the check too")
    why = sub.add_parser("explain", help="show which rules apply to a request, and why")
    why.add_argument("file")
    why.add_argument(
        "--attr",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a request attribute (method, path, ip, user, plan, ...)",
    )
    why.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                     help="a request header")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            if serve_missing:
                print("ratewarden serve needs: pip install 'ratewarden[server,grpc]'",
                      file=sys.stderr)  # fmt: skip
                return 1
            from .server import options_from, run  # noqa: PLC0415

            return run(options_from(args))
        if args.command == "demo":
            demo()
        elif args.command == "check-config":
            return check_config(args.file, strict=args.strict)
        elif args.command == "explain":
            return explain(args.file, args.attr, args.header)
    except RatewardenError as exc:
        print(f"ratewarden: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rule evaluation: the compiled index vs a naive linear scan over the same rules.

Run from the project root:

    .venv/bin/python bench/bench_rules.py           # full run, about a minute
    .venv/bin/python bench/bench_rules.py --quick   # smoke run, a few seconds

What it measures: ``RuleSet.evaluate(attributes)`` alone (attributes in, applicable
limits out; no store, no counting), per request, on rule sets of 10, 1,000 and
10,000 rules that mix exact paths, ``{param}`` paths, prefixes, globs, methods and
plan attributes, in groups and as tiers, plus three rules that apply to every
request (per user, else per ip; and a global log_only), so that a typical request
gets 3-4 limits.

The anchor is what one writes without an index: the same compiled rules in rank
order, each checked in turn (path regexes compiled once, methods and attributes as
sets), the first match of each group kept. Both run in the same process, round
robin over the same pre-built requests, and must return the same rules for every
request (checked before timing). The table gives the minimum and the median over
rounds of the mean us per request; the targets use the minimum.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec

import ratewarden
from ratewarden.rules import CompiledRule, Match, Rule, RuleFile, RuleSet
from ratewarden.rules._compile import compile_rules

SIZES = (10, 1_000, 10_000)
EVERYWHERE = 3  # per-user, per-ip, service-wide


def make_rules(n: int) -> RuleFile:
    rules = [
        Rule(name="per-user", group="caller", priority=10, rate="50/second", by="user"),
        Rule(name="per-ip", group="caller", rate="10/second", by="ip"),
        Rule(name="service-wide", rate="5000/second", global_=True, action="log_only"),
    ]
    for i in range(n - EVERYWHERE):
        kind = i % 5
        if kind == 0:
            match = Match(paths=f"/api/v1/res{i}", methods="GET")
            rule = Rule(name=f"r{i}", group="endpoint", rate="100/minute", by="user", match=match)
        elif kind == 1:
            match = Match(paths=f"/api/v1/res{i}/{{id}}", methods=["GET", "POST"])
            rule = Rule(name=f"r{i}", group="endpoint", rate="60/minute", by="user", match=match)
        elif kind == 2:
            rule = Rule(name=f"r{i}", rate="1000/hour", by="api_key",
                        match=Match(paths=f"/svc{i}/*"))  # fmt: skip
        elif kind == 3:
            rule = Rule(name=f"r{i}", group="plan", rate="1000/day", by="org",
                        match=Match(attributes={"plan": f"p{i}"}))  # fmt: skip
        else:
            match = Match(paths=f"/files{i}/*/meta", methods="DELETE")
            rule = Rule(name=f"r{i}", rate="10/minute", by="user", match=match)
        rules.append(rule)
    return RuleFile(rules=rules)


def make_requests(n: int, count: int, seed: int = 7) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for _ in range(count):
        i = rng.randrange(max(1, n - EVERYWHERE))
        kind = i % 5
        attrs: dict[str, object] = {
            "method": "GET",
            "ip": f"10.1.{rng.randrange(256)}.{rng.randrange(256)}",
            "user": f"user-{rng.randrange(10_000)}",
            "org": f"org-{rng.randrange(100)}",
            "plan": "free",
            "api_key": f"key-{rng.randrange(1000)}",
            "path": "/healthz",
        }
        if rng.random() < 0.2:  # some requests match nothing specific
            attrs["path"] = f"/nothing/{rng.randrange(10**6)}"
        elif kind == 0:
            attrs["path"] = f"/api/v1/res{i}"
        elif kind == 1:
            attrs["path"] = f"/api/v1/res{i}/{rng.randrange(10**6)}"
            attrs["method"] = rng.choice(["GET", "POST"])
        elif kind == 2:
            attrs["path"] = f"/svc{i}/x/y"
        elif kind == 3:
            attrs["plan"] = f"p{i}"
        else:
            attrs["path"] = f"/files{i}/{rng.randrange(999)}/meta"
            attrs["method"] = "DELETE"
        if rng.random() < 0.3:
            del attrs["user"]  # anonymous: per ip instead
        out.append(attrs)
    return out


class LinearScan:
    """The anchor: every rule checked in rank order, first match per group kept."""

    def __init__(self, ruleset: RuleSet) -> None:
        self.rules = [
            (rule, [re.compile(p.regex) for p in rule.paths])
            for rule in sorted(ruleset.rules, key=lambda r: r.rank)
        ]

    def evaluate(self, attributes: Mapping[str, object]) -> list[tuple[CompiledRule, str]]:
        taken: set[str] = set()
        out = []
        path = attributes.get("path")
        method = attributes.get("method")
        for rule, regexes in self.rules:
            if rule.group_key in taken:
                continue
            if regexes and not (
                isinstance(path, str) and any(r.fullmatch(path, 1) for r in regexes)
            ):
                continue
            if rule.methods is not None and method not in rule.methods:
                continue
            if any(attributes.get(name) not in values for name, values in rule.attributes):
                continue
            key = rule.key(attributes)
            if key is None:
                continue
            taken.add(rule.group_key)
            out.append((rule, key))
        return out


def timed(fn: Callable[[Mapping[str, object]], object], requests: list[dict[str, object]]) -> float:
    gc.collect()
    start = time.perf_counter_ns()
    for attributes in requests:
        fn(attributes)
    return (time.perf_counter_ns() - start) / len(requests) / 1000


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True, cwd=Path(__file__).parent)  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    rounds = 3 if args.quick else 9
    count = 500 if args.quick else 4000
    print(f"bench_rules.py  {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC  commit {commit()}")
    print(f"Python {platform.python_version()} ({platform.python_implementation()}),"
          f" {platform.machine()}, ratewarden {ratewarden.__version__},"
          f" msgspec {msgspec.__version__}")  # fmt: skip
    print(f"{rounds} rounds; us per request, min / median over rounds\n")
    header = f"{'rules':>7}  {'compile':>9}  {'index (ours)':>16}  {'linear scan':>18}  ratio"
    print(header)
    print("-" * len(header))
    for size in SIZES:
        rule_file = make_rules(size)
        start = time.perf_counter()
        ruleset = compile_rules(rule_file)
        compile_s = time.perf_counter() - start
        anchor = LinearScan(ruleset)
        requests = make_requests(size, count)
        # the anchor is slow at 10k rules: fewer requests, same per-request figure
        anchor_requests = requests[: max(50, count * 10 // size)] if size > 100 else requests
        for attributes in requests[:500]:
            ours = sorted((a.rule.name, a.key) for a in ruleset.evaluate(attributes))
            naive = sorted((r.name, k) for r, k in anchor.evaluate(attributes) for _ in r.limits)
            if ours != naive:
                sys.exit(f"disagreement on {attributes}: {ours} != {naive}")
        applicable = statistics.mean(len(ruleset.evaluate(a)) for a in requests)
        mine: list[float] = []
        theirs: list[float] = []
        for r in range(rounds):
            pair = [(mine, ruleset.evaluate, requests), (theirs, anchor.evaluate, anchor_requests)]
            for sink, fn, reqs in pair if r % 2 == 0 else pair[::-1]:
                sink.append(timed(fn, reqs))
        ratio = min(theirs) / min(mine)
        ours = f"{min(mine):>7.2f} / {statistics.median(mine):<6.2f}"
        anchor_text = f"{min(theirs):>8.2f} / {statistics.median(theirs):<7.2f}"
        print(f"{size:>7,}  {compile_s * 1000:>7.0f}ms  {ours}  {anchor_text}  {ratio:>5.1f}x"
              f"   ({applicable:.1f} limits per request)")  # fmt: skip


if __name__ == "__main__":
    main()

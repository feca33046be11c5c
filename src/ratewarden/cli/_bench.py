"""``ratewarden bench``: how many checks a second this machine does, one thread,
one check at a time: each algorithm (or one) on the memory store or a Redis, or
a rule file's requests through the rule engine.

A quick figure for a user sizing a deployment, not the project's benchmarks
(bench/ in the repository compares against other libraries and is not shipped).
Each run lasts ``--seconds`` of wall time; a progress bar shows on a terminal.
"""

from __future__ import annotations

import argparse
import platform
import time
import uuid
from collections.abc import Callable
from typing import Any

from .. import __version__
from ..algorithms import ALGORITHMS
from ..stores import Store
from ._common import (
    STORE_HELP,
    USAGE,
    CliError,
    Progress,
    load_rule_file,
    opened_store,
    parse_pairs,
    print_json,
    redact,
    table,
)

__all__ = ["add_bench", "bench"]

# Checks between two reads of the clock and two updates of the bar: few enough
# to stop within a few ms of the deadline on Redis, many enough to cost nothing.
BATCH = 64
MAX_SECONDS = 3600.0


def add_bench(sub: Any, epilog: str) -> None:
    bench = sub.add_parser(
        "bench",
        help="measure checks per second on this machine: algorithms or a rule file",
        description="Measure how many checks a second one thread does, one at a time: each "
        "algorithm (or --algorithm) hitting --keys keys on the memory store or --store, or, "
        "given a rule file and a request's NAME=VALUE attributes, the rule engine checking "
        "that request (--vary NAME spreads it over --keys values of one attribute). On Redis "
        "the keys are named bench-<random>:... and expire with their windows.",
        epilog=epilog,
    )
    bench.add_argument(
        "words",
        nargs="*",
        metavar="[RULES.yaml NAME=VALUE ...]",
        help="a rule file and the request to check (default: the algorithms)",
    )
    bench.add_argument(
        "--algorithm",
        choices=(*ALGORITHMS, "all"),
        default="all",
        help="without a rule file: the algorithm (default: all, one run each)",
    )
    bench.add_argument(
        "--rate",
        default="1000/second",
        help="without a rule file: each key's limit (default 1000/second)",
    )
    bench.add_argument(
        "--keys",
        type=int,
        default=1000,
        metavar="N",
        help="distinct keys (or --vary values) hit in turn (default 1000)",
    )
    bench.add_argument(
        "--vary", metavar="NAME", help="with a rule file: the attribute whose value changes per key"
    )
    bench.add_argument(
        "--seconds", type=float, default=1.0, metavar="S", help="each run's length (default 1)"
    )
    bench.add_argument("--store", default="memory", metavar="URL", help=STORE_HELP)
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")


Hit = Callable[[int], bool]


def _limiter_runs(args: argparse.Namespace, store: Store) -> dict[str, Hit]:
    from ..kernel import Limiter  # noqa: PLC0415

    prefix = f"bench-{uuid.uuid4().hex[:10]}"
    keys = [f"k{n}" for n in range(args.keys)]
    runs: dict[str, Hit] = {}
    names = ALGORITHMS if args.algorithm == "all" else (args.algorithm,)
    for name in names:
        limiter = Limiter(args.rate, algorithm=name, store=store, name=f"{prefix}:{name}")

        def hit(n: int, limiter: Limiter = limiter) -> bool:
            return limiter.hit(keys[n % len(keys)]).allowed

        runs[name] = hit
    return runs


def _rule_runs(path: str, pairs: list[str], args: argparse.Namespace, store: Store) -> Hit:
    ruleset = load_rule_file(path)
    from ..rules import RuleEngine  # noqa: PLC0415 - PyYAML, there since the file loaded

    attributes: dict[str, object] = dict(parse_pairs(pairs, "an attribute"))
    if args.vary is None:
        requests = [attributes]
    else:
        base = attributes.get(args.vary, args.vary)
        requests = [{**attributes, args.vary: f"{base}-{n}"} for n in range(args.keys)]
    engine = RuleEngine(ruleset, store)

    def hit(n: int) -> bool:
        return engine.check(requests[n % len(requests)]).allowed

    return hit


def _measure(hit: Hit, seconds: float, progress: Progress) -> tuple[int, int, float]:
    """Checks done, checks allowed, seconds taken: whole batches until the time is up."""
    start = time.perf_counter()
    deadline = start + seconds
    base = progress.done
    done = allowed = 0
    while True:
        for n in range(done, done + BATCH):
            allowed += hit(n)
        done += BATCH
        now = time.perf_counter()
        progress.update(base + now - start)
        if now >= deadline:
            return done, allowed, now - start


def bench(args: argparse.Namespace) -> int:
    words = list(args.words)
    path = words.pop(0) if words and "=" not in words[0] else None
    if path is None and (words or args.vary is not None):
        raise CliError("NAME=VALUE attributes and --vary go with a rule file", USAGE)
    if not 0 < args.seconds <= MAX_SECONDS:
        raise CliError(
            f"--seconds takes more than 0 and at most {MAX_SECONDS:g}, got {args.seconds:g}", USAGE
        )
    if args.keys < 1:
        raise CliError(f"--keys takes a whole number >= 1, got {args.keys}", USAGE)
    store_name = redact(args.store)
    with opened_store(args.store) as store:
        if path is None:
            runs = _limiter_runs(args, store)
        else:
            runs = {path: _rule_runs(path, words, args, store)}
        rows: list[dict[str, Any]] = []
        with Progress(args.seconds * len(runs), json=args.json) as progress:
            for name, hit in runs.items():
                progress.label = name
                checks, allowed, took = _measure(hit, args.seconds, progress)
                rows.append(
                    {
                        "run": name,
                        "store": store_name,
                        "checks": checks,
                        "seconds": round(took, 4),
                        "checks_per_second": round(checks / took),
                        "us_per_check": round(1e6 * took / checks, 2),
                        "allowed": round(allowed / checks, 4),
                    }
                )
    python = f"{platform.python_implementation()} {platform.python_version()}"
    if args.json:
        print_json({"ratewarden": __version__, "python": python, "runs": rows})
        return 0
    what = f"{args.keys} keys at {args.rate}" if path is None else "the rule engine"
    print(f"ratewarden {__version__} on {python}: one thread, one check at a time, {what}")
    lines = [["run", "store", "checks", "checks/s", "us/check", "allowed"]]
    lines.extend(
        [
            r["run"],
            r["store"],
            str(r["checks"]),
            f"{r['checks_per_second']:,}",
            f"{r['us_per_check']:.2f}",
            f"{100 * r['allowed']:.1f}%",
        ]
        for r in rows
    )
    print(table(lines))
    return 0

"""``ratewarden check``: one request, described by ``NAME=VALUE`` attributes,
checked against a rule file (on a fresh memory store, or on the counters of a
Redis store) or against a running service, and the decision printed; the exit
code says allowed (0) or denied (1).

Both ways answer in the shape of the service's ``POST /v1/check`` (and, for
``--times N``, of ``POST /v1/check/batch``), so ``--json`` output is the same
whichever answered.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from ._common import (
    NO,
    OK,
    STORE_HELP,
    UNREACHABLE,
    USAGE,
    CliError,
    load_rule_file,
    opened_store,
    parse_pairs,
    print_json,
    table,
)
from ._remote import add_service_arguments, client_from

__all__ = ["add_check", "check"]

MAX_TIMES = 1000  # the service's batch limit


def add_check(sub: Any, epilog: str) -> None:
    check = sub.add_parser(
        "check",
        help="check one request against a rule file or a running service",
        description="Check one request, given as NAME=VALUE attributes (method, path, ip, user, "
        "plan, ...), against a rule file or a running service, and print the decision. "
        "With a rule file the request counts on a fresh memory store (--store: on a Redis "
        "store's counters, as the service would); with --url the service decides and counts. "
        "The exit code is 0 when the (last) request is allowed, 1 when it is denied.",
        epilog=epilog,
    )
    check.add_argument(
        "words",
        nargs="*",
        metavar="[RULES.yaml] NAME=VALUE",
        help="the rule file (not with --url), then the request's attributes",
    )
    check.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a request header (repeat)",
    )
    check.add_argument(
        "--cost", type=int, default=1, metavar="N", help="the request counts as N (default 1)"
    )
    check.add_argument(
        "--times",
        type=int,
        default=1,
        metavar="N",
        help=f"send it N times, one after the other (1-{MAX_TIMES}; default 1)",
    )
    check.add_argument("--store", metavar="URL", help=f"with a rule file: {STORE_HELP}")
    add_service_arguments(check)
    check.add_argument("--json", action="store_true", help="print the answer as JSON")


def _request(args: argparse.Namespace) -> tuple[str | None, dict[str, Any]]:
    """The rule file (None: ask the service) and the attributes."""
    words = list(args.words)
    path = None
    if words and "=" not in words[0]:
        path = words.pop(0)
    if path is not None and args.url is not None:
        raise CliError(
            "give a rule file or --url, not both: with --url the service's rules decide", USAGE
        )
    if path is None and args.store is not None:
        raise CliError("--store goes with a rule file (a service has its own store)", USAGE)
    if not 1 <= args.times <= MAX_TIMES:
        raise CliError(f"--times takes 1 to {MAX_TIMES}, got {args.times}", USAGE)
    if args.cost < 1:
        raise CliError(f"--cost takes a whole number >= 1, got {args.cost}", USAGE)
    attributes: dict[str, Any] = dict(parse_pairs(words, "an attribute"))
    headers = parse_pairs(args.header, "--header")
    if headers:
        attributes["headers"] = {name.lower(): value for name, value in headers.items()}
    return path, attributes


def _in_memory(path: str, attributes: dict[str, Any], args: argparse.Namespace) -> list[Any]:
    import msgspec  # noqa: PLC0415

    ruleset = load_rule_file(path)
    from ..rules import RuleEngine  # noqa: PLC0415 - PyYAML, there since the file loaded
    from ..server import outcome_result  # noqa: PLC0415 - msgspec and the rules only

    with opened_store(args.store or "memory") as store:
        engine = RuleEngine(ruleset, store)
        outcomes = [engine.check(attributes, cost=args.cost) for _ in range(args.times)]
    return [msgspec.to_builtins(outcome_result(outcome)) for outcome in outcomes]


def _from_service(attributes: dict[str, Any], args: argparse.Namespace) -> list[Any]:
    client = client_from(args)
    one = {"attributes": attributes, "cost": args.cost}
    if args.times == 1:
        return [client.request("POST", "/v1/check", one)]
    answer = client.request("POST", "/v1/check/batch", {"checks": [one] * args.times})
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or len(results) != args.times:
        raise CliError(
            f"{client.url}/v1/check/batch: an answer without its {args.times} "
            "results: is this a ratewarden service?",
            UNREACHABLE,
        )
    return results


def _seconds(value: Any) -> str:
    if value is None:
        return "never"
    if not isinstance(value, int | float) or not math.isfinite(value):
        return str(value)
    return f"{value:.3g}s"


def _log_only(result: dict[str, Any]) -> tuple[str, str | None]:
    """The ``log_only`` column's cell, and the log_only rule that would have denied
    the request (None when none would): a verdict shown, never acted on."""
    shadow = result.get("shadow")
    if not isinstance(shadow, dict):
        return "-", None  # no log_only rule applied (or a real limit denied first)
    if shadow.get("allowed") is not False:
        return "would allow", None
    rule = str(shadow.get("rule") or "?")
    return f"would deny: {rule}", rule


def _show(results: list[dict[str, Any]]) -> None:
    header = ["#", "allowed", "action", "status", "rule", "limit", "remaining", "reset after",
              "retry after", "wait"]  # fmt: skip
    # A log_only rule changes no answer, so its verdict needs a column of its own,
    # shown where one applied
    watched = any(isinstance(r.get("shadow"), dict) for r in results)
    rows = [[*header, "log_only"] if watched else header]
    denied_by: dict[str, list[str]] = {}
    for n, r in enumerate(results, 1):
        row = [
            str(n),
            "yes" if r.get("allowed") else "no",
            str(r.get("action")),
            str(r.get("status")),
            r.get("rule") or "-",
            "-" if r.get("limit") is None else str(r["limit"]),
            "-" if r.get("remaining") is None else str(r["remaining"]),
            "-" if r.get("reset_after") is None else _seconds(r["reset_after"]),
            _seconds(r.get("retry_after")),
            _seconds(r.get("wait")),
        ]
        if watched:
            cell, rule = _log_only(r)
            row.append(cell)
            if rule is not None:
                denied_by.setdefault(rule, []).append(f"#{n}")
        rows.append(row)
    print(table(rows))
    for rule, numbers in denied_by.items():
        print(f"log_only: rule {rule} would have denied {', '.join(numbers)}; "
              "it only logs, so the answers stand")  # fmt: skip
    headers = results[-1].get("headers") or {}
    for name, value in headers.items():
        print(f"  {name}: {value}")


def check(args: argparse.Namespace) -> int:
    """0 when the last request is allowed, 1 when denied, 3 when the store did not
    answer and a failure policy decided instead."""
    path, attributes = _request(args)
    if path is None:
        results = _from_service(attributes, args)
    else:
        results = _in_memory(path, attributes, args)
    if args.json:
        print_json(results[0] if args.times == 1 else {"results": results})
    else:
        _show(results)
    if any(isinstance(r, dict) and r.get("degraded") for r in results):
        print(
            "ratewarden check: the store did not answer: a rule's on_failure policy decided",
            file=sys.stderr,
        )
        return UNREACHABLE
    last = results[-1]
    return OK if isinstance(last, dict) and last.get("allowed") is True else NO

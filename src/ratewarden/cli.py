"""The ``ratewarden`` command: ``serve``, ``demo``, ``check-config FILE``,
``explain FILE --attr k=v``, ``quota set|show|list``, ``simulate``.

The rule commands import ``ratewarden.rules`` (and so PyYAML) only when they run,
``serve`` the server packages only when it runs, ``quota`` the fleet quotas (and
so the Redis client) only when it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import __version__
from ._clock import FakeClock
from ._errors import ConfigurationError, RateLimitTimeout, RatewardenError
from ._limiter import AsyncLimiter, Limiter
from .algorithms import ALGORITHMS
from .stores import MemoryStore

if TYPE_CHECKING:
    from .fleet import MemberStatus, QuotaConfig, QuotaStatus
    from .rules import CompiledRule

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
# Seconds a Redis command of `ratewarden quota` may take (connecting included).
QUOTA_TIMEOUT = 5.0


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


# -- ratewarden quota ---------------------------------------------------------------


def _permits(value: float) -> str:
    """A number of permits: whole ones as they are, parts of one to two decimals
    (one from 10 up), no trailing zeros."""
    if value == int(value):
        return str(int(value))
    text = f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return text.rstrip("0").rstrip(".")


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def _settings(config: QuotaConfig) -> list[tuple[str, str]]:
    """What ``quota set`` prints, field by field."""
    safe = config.safe if config.safe == "equal" else f"{config.safe} permits"
    return [
        ("rate", str(config.rate)),
        ("algorithm", config.algorithm),
        ("refresh", f"{config.refresh:g}s"),
        ("lease", f"{config.lease:g}s"),
        ("safe", str(safe)),
        ("cap", str(config.cap)),
        ("adaptive", "yes" if config.adaptive else "no"),
        ("floor", str(config.floor)),
    ]


def _safe(text: str) -> str | int:
    if text == "equal":
        return text
    if text.isdigit():
        return int(text)
    raise ConfigurationError(f"--safe takes 'equal' or a number of permits, got {text!r}")


def quota_set(client: Any, args: argparse.Namespace) -> int:
    """Create the resource, or change the settings given and keep the others."""
    from ._rate import parse_rate  # noqa: PLC0415
    from .fleet import QuotaConfig, set_quota, show_quota  # noqa: PLC0415

    given: dict[str, Any] = {
        "algorithm": args.algorithm, "refresh": args.refresh, "lease": args.lease,
        "safe": None if args.safe is None else _safe(args.safe), "cap": args.cap,
        "adaptive": args.adaptive, "floor": args.floor,
    }  # fmt: skip
    changes = {name: value for name, value in given.items() if value is not None}
    if args.rate is not None:
        changes["rate"] = parse_rate(args.rate)
    current = show_quota(client, args.name)
    if current is None:
        if args.rate is None:
            raise ConfigurationError(f"no quota named {args.name!r}: give a RATE to create it")
        config = QuotaConfig(**changes)
        version = set_quota(client, args.name, config)
        print(f"created quota {args.name}, version {version}")
        for name, text in _settings(config):
            print(f"  {name:<10} {text}")
        return 0
    config = current.config.but(**changes)
    if config == current.config:
        print(f"quota {args.name} unchanged, version {current.version}")
        return 0
    version = set_quota(client, args.name, config)
    print(f"changed quota {args.name}, version {current.version} -> {version}")
    for (name, old), (_, new) in zip(_settings(current.config), _settings(config), strict=True):
        if old != new:
            print(f"  {name:<10} {old} -> {new}")
    return 0


def _resource_line(status: QuotaStatus) -> str:
    config = status.config
    algorithm = config.algorithm
    if algorithm == "static":
        algorithm += f" (cap {config.cap})"
    parts = [
        f"quota {status.name}: {config.rate}",
        f"effective total {_permits(status.effective_total)}",
        algorithm,
        f"refresh {config.refresh:g}s",
        f"lease {config.lease:g}s",
        f"safe {config.safe}",
    ]
    if config.adaptive:
        parts.append(f"adaptive (floor {config.floor})")
    parts.append(f"version {status.version}")
    return ", ".join(parts)


def _lease_left(member: MemberStatus) -> str:
    return f"{member.expires_in:.1f}s" if member.expires_in > 0 else "expired"


def quota_show(client: Any, args: argparse.Namespace) -> int:
    from .fleet import show_quota  # noqa: PLC0415

    status = show_quota(client, args.name)
    if status is None:
        raise ConfigurationError(f"no quota named {args.name!r}")
    if args.json:
        print(json.dumps(status.as_dict(), indent=2))
        return 0
    print(_resource_line(status))
    window = status.config.rate.period
    print(f"permits per {window:g}s window; utilisation: used over the grant (members),"
          " over min(effective total, wants) (total)")  # fmt: skip
    if not status.members:
        print("no live members")
        return 0
    if args.members_by_id:
        members = sorted(status.members, key=lambda m: m.id)
    else:  # the largest holders first
        members = sorted(status.members, key=lambda m: (-m.has, m.id))
    rows = [["member", "wants", "has", "used", "utilisation", "lease left"]]
    rows.extend(
        [m.id, _permits(m.wants), _permits(m.has), _permits(m.used), _percent(m.used, m.has),
         _lease_left(m)]
        for m in members
    )  # fmt: skip
    rows.append([f"total ({len(members)})", _permits(status.wants), _permits(status.granted),
                 _permits(status.used), f"{100 * status.utilisation:.0f}%", ""])  # fmt: skip
    print(_table(rows))
    return 0


def quota_list(client: Any, args: argparse.Namespace) -> int:
    from .fleet import show_quota  # noqa: PLC0415
    from .fleet._admin import list_quotas  # noqa: PLC0415
    from .server._quotas import MAX_LISTED, summary  # noqa: PLC0415 - msgspec only

    names = list_quotas(client, MAX_LISTED + 1)
    truncated = len(names) > MAX_LISTED
    statuses = []
    for name in names[:MAX_LISTED]:
        try:
            status = show_quota(client, name)
        except ConfigurationError as exc:
            print(f"warning: quota {name!r} left out: {exc}", file=sys.stderr)
            continue
        if status is not None:  # gone since it was listed
            statuses.append(status)
    if args.json:
        listed = {"quotas": [summary(s) for s in statuses], "truncated": truncated}
        print(json.dumps(listed, indent=2))
        return 0
    if not statuses:
        print("no quotas")
        return 0
    rows = [["name", "rate", "effective", "algorithm", "members", "wants", "granted", "used",
             "utilisation", "version"]]  # fmt: skip
    rows.extend(
        [s.name, str(s.config.rate), _permits(s.effective_total), s.config.algorithm,
         str(len(s.members)), _permits(s.wants), _permits(s.granted), _permits(s.used),
         f"{100 * s.utilisation:.0f}%", str(s.version)]
        for s in statuses
    )  # fmt: skip
    print(_table(rows))
    if truncated:
        print(f"(the first {MAX_LISTED} quotas found only)")
    return 0


def quota(args: argparse.Namespace) -> int:
    """``ratewarden quota set|show|list``; 2 and one line on stderr for an error."""
    try:
        from redis.exceptions import RedisError  # noqa: PLC0415 - the redis extra

        from .stores._redisconn import connect  # noqa: PLC0415
    except ImportError:
        print("ratewarden quota needs: pip install 'ratewarden[redis]'", file=sys.stderr)
        return 2
    url = args.redis or os.environ.get("RATEWARDEN_REDIS") or DEFAULT_REDIS
    commands = {"set": quota_set, "show": quota_show, "list": quota_list}
    try:
        client = connect(url, QUOTA_TIMEOUT)
        try:
            return commands[args.quota_command](client, args)
        finally:
            client.close()
    except (RatewardenError, RedisError) as exc:
        print(f"ratewarden quota: {exc}", file=sys.stderr)
        return 2


def _add_quota(sub: Any) -> None:
    quota = sub.add_parser("quota", help="fleet quotas in Redis: set, show, list")
    verbs = quota.add_subparsers(dest="quota_command", required=True)
    redis_help = f"the Redis of the quotas (default $RATEWARDEN_REDIS or {DEFAULT_REDIS})"
    change = verbs.add_parser(
        "set", help="create a quota, or change it (the settings not given stay as they are)"
    )
    change.add_argument("name")
    change.add_argument("rate", nargs="?", help="the fleet's total, such as 2000/second "
                        "(needed to create the quota)")  # fmt: skip
    change.add_argument("--algorithm", metavar="A", help="equal, proportional_share, "
                        "fair_share (the default) or static")  # fmt: skip
    change.add_argument("--refresh", type=float, metavar="SECONDS",
                        help="between a member's reports (default 1)")  # fmt: skip
    change.add_argument("--lease", type=float, metavar="SECONDS",
                        help="a silent member's share outlives its last report by this "
                        "(default 5)")  # fmt: skip
    change.add_argument("--safe", metavar="equal|N",
                        help="a member cut off from Redis falls back to: the equal share, "
                        "or N permits a window")  # fmt: skip
    change.add_argument("--cap", type=int, metavar="N", help="static: permits per member")
    change.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=None,
                        help="lower the total when the provider refuses members within "
                        "their shares")  # fmt: skip
    change.add_argument("--floor", type=int, metavar="N",
                        help="adaptive: the total never goes below this")  # fmt: skip
    change.add_argument("--redis", metavar="URL", help=redis_help)
    show = verbs.add_parser("show", help="a quota, its members and their use")
    show.add_argument("name")
    show.add_argument("--json", action="store_true", help="print it as JSON")
    show.add_argument("--members-by-id", action="store_true",
                      help="members in order of id (default: the largest grant first)")  # fmt: skip
    show.add_argument("--redis", metavar="URL", help=redis_help)
    listing = verbs.add_parser("list", help="every quota, summed up")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    listing.add_argument("--redis", metavar="URL", help=redis_help)


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
    _add_quota(sub)
    simulate = sub.add_parser(
        "simulate", help="a fleet quota's members on a virtual clock: figures and plots"
    )
    # its options need the fleet package (and so the Redis client): imported only
    # when the command is simulate, as quota's and serve's packages are
    words = sys.argv[1:] if argv is None else list(argv)
    simulate_missing = True
    if words[:1] == ["simulate"]:
        try:
            from .fleet import _simulate  # noqa: PLC0415 - the Redis client, if installed
        except ImportError:
            pass
        else:
            simulate_missing = False
            _simulate.add_arguments(simulate)
    args = parser.parse_args(argv)
    try:
        if args.command == "quota":
            return quota(args)
        if args.command == "simulate":
            if simulate_missing:
                print("ratewarden simulate needs: pip install 'ratewarden[simulate]'",
                      file=sys.stderr)  # fmt: skip
                return 1
            return _simulate.main(args)
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

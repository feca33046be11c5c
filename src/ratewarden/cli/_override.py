"""``ratewarden override set|clear|list``: runtime overrides of a rule's rates.

Through a running service (``--url``: it checks the override against the rules
it has in force), or straight in a Redis (``--store redis://... --rules FILE``,
checked against FILE) for library processes with no service in front. Either
way, every service and library process on that Redis applies the change within
a second.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import time
from typing import Any
from urllib.parse import quote, urlencode

from ._common import OK, UNREACHABLE, USAGE, CliError, examples, print_json, table
from ._remote import add_service_arguments, client_from

__all__ = ["add_parser", "run"]

SET_EXAMPLES = examples(
    'ratewarden override set order-reads 500/minute --for 30m --reason "incident 7: retry storm"'
    " --url http://127.0.0.1:8080 --token-file token",
    'ratewarden override set login-per-ip 10/minute,40/hour --for 1h --reason "event"'
    " --url http://127.0.0.1:8080 --token-file token --json",
    'ratewarden override set per-ip 20/second --for 90s --reason "no service in front"'
    " --store redis://127.0.0.1:6379/0 --rules rules.yaml",
)
CLEAR_EXAMPLES = examples(
    'ratewarden override clear order-reads --reason "over" --url http://127.0.0.1:8080'
    " --token-file token",
    "ratewarden override clear per-ip --store redis://127.0.0.1:6379/0 --rules rules.yaml",
)
LIST_EXAMPLES = examples(
    "ratewarden override list --url http://127.0.0.1:8080 --token-file token",
    "ratewarden override list --audit 20 --url http://127.0.0.1:8080 --token-file token --json",
    "ratewarden override list --store redis://127.0.0.1:6379/0 --rules rules.yaml",
)


def add_parser(sub: Any) -> None:
    override = sub.add_parser(
        "override",
        help="replace a rule's rates for a while, on every instance: set, clear, list",
        description="Runtime overrides: a rule's rates replaced for a while without editing "
        "the rule file. Through a service (--url), or in a Redis (--store, --rules). On a "
        "Redis every service and library process on it applies a change within a second, "
        "and an audit trail records who, when, why and what was replaced.",
        epilog=examples(
            'ratewarden override set order-reads 500/minute --for 30m --reason "incident 7"'
            " --url http://127.0.0.1:8080 --token-file token",
            "ratewarden override list --url http://127.0.0.1:8080 --token-file token",
        ),
    )
    verbs = override.add_subparsers(dest="override_command", required=True, metavar="VERB")
    change = verbs.add_parser(
        "set",
        help="replace a rule's rates until --for has passed",
        description="Replace RULE's rates with RATES until --for has passed. A rule with one "
        "rate takes one; a rule with several has each given rate replace the rate with the "
        "same window (10/minute replaces the per-minute one). An overridden rate counts "
        "afresh; when the override ends the rule's own counters apply again.",
        epilog=SET_EXAMPLES,
    )
    change.add_argument("rule")
    change.add_argument("rates", metavar="RATES", help="such as 500/minute, or 10/second,400/hour")
    change.add_argument(
        "--for", dest="duration", required=True, metavar="DURATION",
        help="how long: seconds, or 90s, 30m, 2h, 1d, 1h30m (at most 30 days)",
    )  # fmt: skip
    change.add_argument("--reason", required=True, help="why, for the audit trail")
    _common(change)
    end = verbs.add_parser(
        "clear",
        help="end a rule's override now",
        description="End RULE's override now; the rule file's rates apply again.",
        epilog=CLEAR_EXAMPLES,
    )
    end.add_argument("rule")
    end.add_argument("--reason", default="", help="why, for the audit trail")
    _common(end)
    show = verbs.add_parser(
        "list",
        help="the overrides in force, and the latest changes",
        description="The overrides in force, with the time each has left; --audit N: the "
        "last N changes too (1000 are kept).",
        epilog=LIST_EXAMPLES,
    )
    show.add_argument(
        "--audit", type=int, default=0, metavar="N",
        help="show the last N changes (who, when, why, what was replaced)",
    )  # fmt: skip
    _common(show, author=False)


def _common(parser: argparse.ArgumentParser, *, author: bool = True) -> None:
    add_service_arguments(parser)
    parser.add_argument(
        "--store", metavar="URL",
        help="a Redis URL: change the overrides there directly, with --rules",
    )  # fmt: skip
    parser.add_argument(
        "--rules", metavar="RULES.yaml",
        help="with --store: the rule file the overrides are checked against",
    )  # fmt: skip
    if author:
        parser.add_argument("--by", help="who, for the audit trail (default: USER@HOST)")
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")


def run(args: argparse.Namespace) -> int:
    if (args.store is None) != (args.rules is None):
        raise CliError("--store and --rules go together (or use --url for a service)", USAGE)
    if args.store is not None and args.url is not None:
        raise CliError("give --url (a service) or --store and --rules (a Redis), not both", USAGE)
    verb = args.override_command
    if verb == "list" and not 0 <= args.audit <= 1000:
        raise CliError(f"--audit takes 0..1000, got {args.audit}", USAGE)
    answer = _direct(args) if args.store is not None else _through_service(args)
    if args.json:
        print_json(answer)
        return OK
    try:
        text = _text(verb, answer, getattr(args, "audit", 0))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        where = "the store" if args.store is not None else "the service"
        message = f"{where} answered what this command cannot read ({type(exc).__name__}: {exc})"
        raise CliError(_cell(message), UNREACHABLE) from None
    print(text)
    return OK


def _by(args: argparse.Namespace) -> str:
    if args.by:
        return str(args.by)
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (OSError, KeyError):  # no user name in a bare container
        return f"?@{socket.gethostname()}"


def _through_service(args: argparse.Namespace) -> Any:
    client = client_from(args)
    verb = args.override_command
    if verb == "set":
        body = {"limits": _rates(args.rates), "for": args.duration, "reason": args.reason,
                "by": _by(args)}  # fmt: skip
        return client.request("PUT", f"/v1/overrides/{quote(args.rule, safe='')}", body)
    if verb == "clear":
        query = urlencode({"reason": args.reason, "by": _by(args)})
        return client.request("DELETE", f"/v1/overrides/{quote(args.rule, safe='')}?{query}")
    listed = client.request("GET", "/v1/overrides")
    if isinstance(listed, dict) and isinstance(listed.get("audit", []), list):
        listed["audit"] = listed.get("audit", [])[: args.audit]
    return listed


def _rates(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _direct(args: argparse.Namespace) -> Any:
    import msgspec  # noqa: PLC0415

    from ..primitives import ConfigurationError  # noqa: PLC0415
    from ..rules import (  # noqa: PLC0415
        RedisOverrides,
        RuleEngine,
        load,
    )
    from ..stores.redis import RedisStore  # noqa: PLC0415
    from ..stores.redis.connection import SCHEMES  # noqa: PLC0415

    if not args.store.startswith(SCHEMES):
        raise CliError(f"--store takes a Redis URL ({', '.join(SCHEMES)}), got {args.store!r}",
                       USAGE)  # fmt: skip
    try:
        ruleset = load(args.rules)
    except ConfigurationError as exc:
        raise CliError(str(exc), USAGE) from None
    with RedisStore(args.store) as store:
        # One change and done: the overrides in that Redis, with no follower
        # thread and no first read (whose failure would be a second line).
        engine = RuleEngine(ruleset, store, overrides=False)
        engine.overrides_source = RedisOverrides(store.client)
        try:
            verb = args.override_command
            if verb == "set":
                override = engine.set_override(args.rule, _rates(args.rates),
                                               duration=args.duration, reason=args.reason,
                                               by=_by(args))  # fmt: skip
                return {"override": msgspec.to_builtins(override), "shared": True}
            if verb == "clear":
                removed = engine.clear_override(args.rule, reason=args.reason, by=_by(args))
                return {"rule": args.rule, "removed": removed, "shared": True}
            audit = engine.override_audit(args.audit) if args.audit else []
            return msgspec.to_builtins(
                {"overrides": engine.list_overrides(), "audit": audit, "shared": True}
            )
        except ConfigurationError as exc:
            raise CliError(str(exc), USAGE) from None
        finally:
            engine.close()


def _cell(value: object) -> str:
    """Text from a service or a Redis as one printable line: whoever wrote it, a
    terminal escape, a line break or a bidi control must not redraw the table."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _rates_of(values: Any) -> str:
    return ", ".join(_cell(v) for v in values)


def _text(verb: str, answer: Any, audit: int) -> str:
    if verb == "set":
        o = answer["override"]
        return (f"{_cell(o['rule'])}: {_rates_of(o['limits'])} (was {_rates_of(o['replaces'])}) "
                f"for {_span(o['expires_in'])}{_scope(answer)}")  # fmt: skip
    if verb == "clear":
        if not answer["removed"]:
            return f"{_cell(answer['rule'])}: no override in force"
        return (f"{_cell(answer['rule'])}: override ended; the rule file's rates apply"
                f"{_scope(answer)}")  # fmt: skip
    lines = []
    overrides = answer["overrides"]
    if overrides:
        rows = [["RULE", "RATES", "REPLACES", "LEFT", "BY", "REASON"]]
        rows += [[_cell(o["rule"]), _rates_of(o["limits"]), _rates_of(o["replaces"]),
                  _span(o["expires_in"]), _cell(o["by"]), _cell(o["reason"])]
                 for o in overrides]  # fmt: skip
        lines.append(table(rows))
    else:
        lines.append("no overrides in force")
    if audit:
        entries = answer["audit"]
        rows = [["AT (UTC)", "ACTION", "RULE", "RATES", "REPLACES", "BY", "REASON"]]
        rows += [[time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(a["at"])), _cell(a["action"]),
                  _cell(a["rule"]), _rates_of(a["limits"]), _rates_of(a["replaces"]),
                  _cell(a["by"]), _cell(a["reason"])] for a in entries]  # fmt: skip
        lines.append("")
        lines.append(table(rows) if entries else "no changes recorded")
    return "\n".join(lines)


def _scope(answer: Any) -> str:
    return "" if answer.get("shared") else " (this service process only: a memory store)"


def _span(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"

"""``ratewarden quota``: fleet quotas set, shown, listed and deleted, in Redis.

Every command ends by naming the Redis it asked, and where that URL came from
(``--store``, ``$RATEWARDEN_REDIS`` or the default): a listing of the wrong
Redis looks like an empty one otherwise. It is the last line of the text, and
a line on stderr with ``--json``, whose stdout stays the service's JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from ..primitives import ConfigurationError, StoreError
from ._common import MISSING, UNREACHABLE, CliError, examples, print_json, redact, table

if TYPE_CHECKING:
    from ..fleet import MemberStatus, QuotaConfig, QuotaStatus

__all__ = ["add_quota", "quota"]

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


class NoSuchQuota(ConfigurationError):
    """A quota the Redis asked does not hold: `quota` names that Redis, since
    asking the wrong one is the likeliest reason."""


class _StoreOption(argparse.Action):
    """``--store`` or ``--redis``, keeping the spelling given, so that the line
    naming the Redis asked names the option the user wrote."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:  # fmt: skip
        setattr(namespace, self.dest, values)
        namespace.redis_option = option_string or "--store"


# Seconds a Redis command of `ratewarden quota` may take (connecting included).
QUOTA_TIMEOUT = 5.0


def _permits(value: float) -> str:
    """A number of permits: whole ones as they are, parts of one to two decimals
    (one from 10 up), no trailing zeros."""
    if value == int(value):
        return str(int(value))
    text = f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return text.rstrip("0").rstrip(".")


def _percent(share: float | None) -> str:
    """A share already held to [0, 1] (see `QuotaStatus.demand_served`), or "-"."""
    return "-" if share is None else f"{100 * share:.0f}%"


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
        ("sliding", "yes" if config.sliding else "no"),
    ]


def _safe(text: str) -> str | int:
    if text == "equal":
        return text
    if text.isdigit():
        return int(text)
    raise ConfigurationError(f"--safe takes 'equal' or a number of permits, got {text!r}")


def quota_set(client: Any, args: argparse.Namespace) -> int:
    """Create the resource, or change the settings given and keep the others."""
    from ..fleet import QuotaConfig, set_quota, show_quota  # noqa: PLC0415
    from ..primitives import parse_rate  # noqa: PLC0415

    given: dict[str, Any] = {
        "algorithm": args.algorithm, "refresh": args.refresh, "lease": args.lease,
        "safe": None if args.safe is None else _safe(args.safe), "cap": args.cap,
        "adaptive": args.adaptive, "floor": args.floor, "sliding": args.sliding,
    }  # fmt: skip
    changes = {name: value for name, value in given.items() if value is not None}
    if args.rate is not None:
        changes["rate"] = parse_rate(args.rate)
    current = show_quota(client, args.name)
    if current is None:
        if args.rate is None:
            raise NoSuchQuota(f"no quota named {args.name!r}: give a RATE to create it")
        config = QuotaConfig(**changes)
        version = set_quota(client, args.name, config)
        if args.json:
            return _set_json(client, args.name, "created")
        print(f"created quota {args.name}, version {version}")
        for name, text in _settings(config):
            print(f"  {name:<10} {text}")
        return 0
    config = current.config.but(**changes)
    if config == current.config:
        if args.json:
            return _set_json(client, args.name, "unchanged")
        print(f"quota {args.name} unchanged, version {current.version}")
        return 0
    version = set_quota(client, args.name, config)
    if args.json:
        return _set_json(client, args.name, "changed")
    print(f"changed quota {args.name}, version {current.version} -> {version}")
    for (name, old), (_, new) in zip(_settings(current.config), _settings(config), strict=True):
        if old != new:
            print(f"  {name:<10} {old} -> {new}")
    return 0


def _set_json(client: Any, name: str, done: str) -> int:
    """What ``quota set --json`` prints: what it did, and the quota as ``show`` has it."""
    from ..fleet import show_quota  # noqa: PLC0415

    status = show_quota(client, name)
    print_json({"done": done, "quota": None if status is None else status.as_dict()})
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
    if config.sliding:
        parts.append("sliding")
    parts.append(f"version {status.version}")
    return ", ".join(parts)


def _lease_left(member: MemberStatus) -> str:
    return f"{member.expires_in:.1f}s" if member.expires_in > 0 else "expired"


def quota_show(client: Any, args: argparse.Namespace) -> int:
    from ..fleet import show_quota  # noqa: PLC0415

    status = show_quota(client, args.name)
    if status is None:
        raise NoSuchQuota(f"no quota named {args.name!r}")
    if args.json:
        print_json(status.as_dict())
        return 0
    print(_resource_line(status))
    window = status.config.rate.period
    print(f"permits per {window:g}s window; utilisation: used over the grant (members),"
          " over the effective total (total); demand served: used over wants (members),"
          " over min(effective total, wants) (total); both at most 100%")  # fmt: skip
    if not status.members:
        print("no live members")
        return 0
    if args.members_by_id:
        members = sorted(status.members, key=lambda m: m.id)
    else:  # the largest holders first
        members = sorted(status.members, key=lambda m: (-m.has, m.id))
    rows = [["member", "wants", "has", "used", "utilisation", "demand served", "lease left"]]
    rows.extend(
        [m.id, _permits(m.wants), _permits(m.has), _permits(m.used), _percent(m.used_of_grant),
         _percent(m.demand_served), _lease_left(m)]
        for m in members
    )  # fmt: skip
    rows.append([f"total ({len(members)})", _permits(status.wants), _permits(status.granted),
                 _permits(status.used), _percent(status.used_of_total),
                 _percent(status.demand_served), ""])  # fmt: skip
    print(table(rows))
    return 0


def quota_list(client: Any, args: argparse.Namespace) -> int:
    from ..fleet import list_quotas, show_quota  # noqa: PLC0415
    from ..server import MAX_LISTED, summary  # noqa: PLC0415 - msgspec only

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
        print_json(listed)
        return 0
    if not statuses:
        print("no quotas")
        return 0
    rows = [["name", "rate", "effective", "algorithm", "members", "wants", "granted", "used",
             "utilisation", "demand served", "version"]]  # fmt: skip
    rows.extend(
        [s.name, str(s.config.rate), _permits(s.effective_total), s.config.algorithm,
         str(len(s.members)), _permits(s.wants), _permits(s.granted), _permits(s.used),
         _percent(s.used_of_total), _percent(s.demand_served), str(s.version)]
        for s in statuses
    )  # fmt: skip
    print(table(rows))
    if truncated:
        print(f"(the first {MAX_LISTED} quotas found only)")
    return 0


def quota_delete(client: Any, args: argparse.Namespace) -> int:
    """Remove the resource's configuration and member records. A configuration
    that cannot be read is removed all the same: that is when one wants it gone."""
    from ..fleet import show_quota  # noqa: PLC0415
    from ..fleet.coordinator import keys  # noqa: PLC0415

    config_key, members_key = keys(args.name)  # a name no quota can have fails here
    records = int(client.hlen(members_key))  # before showing it, which drops ended ones
    try:
        status = show_quota(client, args.name)
        unreadable = None
    except ConfigurationError as exc:
        status, unreadable = None, str(exc)
    removed = int(client.delete(config_key, members_key))
    if removed == 0:
        raise NoSuchQuota(f"no quota named {args.name!r}")
    live = [] if status is None else sorted(m.id for m in status.members)
    if args.json:
        print_json({"deleted": args.name, "keys": [config_key, members_key],
                    "member_records": records, "live_members": live})  # fmt: skip
    else:
        if status is not None:
            what = f"its configuration ({status.config.rate}, version {status.version})"
        elif unreadable is not None:
            what = "its configuration (unreadable)"
        else:
            what = "no configuration"
        print(f"deleted quota {args.name}: {what} and {_records(records)}")
    if live:
        shown = ", ".join(live[:5]) + (f" and {len(live) - 5} more" if len(live) > 5 else "")
        print(f"warning: {_records(len(live), 'live member')} ({shown}) will create the quota "
              "again from what they know at their next refresh: stop them first",
              file=sys.stderr)  # fmt: skip
    return 0


def _records(n: int, what: str = "member record") -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _redis(args: argparse.Namespace) -> tuple[str, str]:
    """The Redis URL to ask, and how to name it: the URL (its password hidden)
    and where it came from."""
    if args.redis:
        return args.redis, f"{redact(args.redis)} ({getattr(args, 'redis_option', '--store')})"
    if url := os.environ.get("RATEWARDEN_REDIS"):
        return url, f"{redact(url)} ($RATEWARDEN_REDIS)"
    return DEFAULT_REDIS, f"{DEFAULT_REDIS} (the default; --store URL to choose)"


def quota(args: argparse.Namespace) -> int:
    """``ratewarden quota set|show|list|delete``. Errors are raised for the command
    line to report: a bad setting or no such quota (2), Redis not answering (3),
    the latter naming the Redis asked."""
    try:
        from ..stores.redis.connection import FAILURES, connect  # noqa: PLC0415 - the redis extra
    except ImportError:
        raise CliError("needs: pip install 'ratewarden[fleet]'", MISSING) from None
    url, asked = _redis(args)
    commands = {"set": quota_set, "show": quota_show, "list": quota_list, "delete": quota_delete}
    client = None
    try:
        client = connect(url, QUOTA_TIMEOUT)
        code = commands[args.quota_command](client, args)
    except NoSuchQuota as exc:
        raise ConfigurationError(f"{exc}; asked {asked}") from None
    except (StoreError, *FAILURES) as exc:
        raise CliError(f"{str(exc).rstrip('.')}; asked {asked}", UNREACHABLE) from None
    finally:
        if client is not None:
            client.close()
    print(f"redis: {asked}", file=sys.stderr if args.json else sys.stdout)
    return code


SET_EXAMPLES = examples(
    "ratewarden quota set partner-api 2000/second --store redis://127.0.0.1:6379/0",
    "ratewarden quota set partner-api --algorithm equal --lease 10"
    " --store redis://127.0.0.1:6379/0 --json",
)
SHOW_EXAMPLES = examples(
    "ratewarden quota show partner-api --store redis://127.0.0.1:6379/0",
    "ratewarden quota show no-such-quota --store redis://127.0.0.1:6379/0  # exits 2",
)
LIST_EXAMPLES = examples("ratewarden quota list --store redis://127.0.0.1:6379/0 --json")
DELETE_EXAMPLES = examples(
    "ratewarden quota delete retired-api --store redis://127.0.0.1:6379/0",
    "ratewarden quota delete no-such-quota --store redis://127.0.0.1:6379/0  # exits 2",
)


def add_quota(sub: Any) -> None:
    quota = sub.add_parser(
        "quota",
        help="fleet quotas in Redis: set, show, list, delete",
        description="Fleet quotas (one provider's limit shared by many instances), in the "
        "Redis their members coordinate through.",
        epilog=examples(
            "ratewarden quota set partner-api 2000/second --store redis://127.0.0.1:6379/0",
            "ratewarden quota list --store redis://127.0.0.1:6379/0",
        ),
    )
    verbs = quota.add_subparsers(dest="quota_command", required=True, metavar="VERB")
    store_help = f"the Redis of the quotas (default $RATEWARDEN_REDIS or {DEFAULT_REDIS})"
    change = verbs.add_parser(
        "set",
        help="create a quota, or change it (the settings not given stay as they are)",
        description="Create a quota, or change the settings given and keep the others; "
        "members hear of a change at once.",
        epilog=SET_EXAMPLES,
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
    change.add_argument("--sliding", action=argparse.BooleanOptionalAction, default=None,
                        help="for a provider that counts rolling windows: no stretch of one "
                        "window, wherever it starts, over the total (costs utilisation "
                        "when demand moves; docs/fleet.md)")  # fmt: skip
    change.add_argument("--json", action="store_true",
                        help="print what was done and the quota as JSON")  # fmt: skip
    show = verbs.add_parser("show", help="a quota, its members and their use",
                            description="Show a quota's settings, its total in force, and "
                            "each member's grant, use and lease, from the Redis its members "
                            "coordinate through.", epilog=SHOW_EXAMPLES)  # fmt: skip
    show.add_argument("name")
    show.add_argument("--json", action="store_true", help="print it as JSON")
    show.add_argument("--members-by-id", action="store_true",
                      help="members in order of id (default: the largest grant first)")  # fmt: skip
    listing = verbs.add_parser("list", help="every quota, summed up", epilog=LIST_EXAMPLES,
                               description="List every quota in the Redis asked, one line "
                               "each: its rate, algorithm, members and use.")  # fmt: skip
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    remove = verbs.add_parser(
        "delete",
        help="remove a quota: its configuration and its members' records",
        description="Remove a quota's configuration and its members' records from Redis. "
        "A member still running creates the quota again at its next refresh, from the "
        "configuration it knows: stop the members first.",
        epilog=DELETE_EXAMPLES,
    )
    remove.add_argument("name")
    remove.add_argument("--json", action="store_true", help="print what was removed as JSON")
    for verb in (change, show, listing, remove):
        # --store as every command names its Redis; --redis as it was first spelled
        verb.add_argument("--store", "--redis", dest="redis", metavar="URL", help=store_help,
                          action=_StoreOption)  # fmt: skip
